package receipt

// Contributions returns each peer's verified work units over rs.
//
// The rule: every agreeing peer of a receipt is credited the shard's full
// WorkUnits. Each of them executed the whole shard, and replication is the
// price of verification, not a discount on the work; so a shard priced p
// verified by r peers adds p·r to the sum of all contributions. Peers whose
// result lost, and shards flagged unverified, earn nothing: they have no
// receipt. A compensating entry (Reverses set) takes back the credit of
// the receipt it reverses from the same peers. Contributions counts what it is given; call Verify first on
// receipts from an untrusted source. Sums saturate at math.MaxInt64
// rather than wrap.
func Contributions(rs []Receipt) map[string]int64 {
	out := make(map[string]int64)
	for i := range rs {
		for _, p := range rs[i].Peers {
			if rs[i].Reverses != 0 {
				out[p] = SubUnits(out[p], rs[i].WorkUnits)
				continue
			}
			out[p] = SatAddUnits(out[p], rs[i].WorkUnits)
		}
	}
	return out
}
