package spot

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// Spot-check choice. The coordinator never draws randomness inside its
// state machine (law 10): the leader draws a Seed from crypto/rand once a
// peer's commitment to its result is in the log, proposes it as a log
// entry, and every replica derives the same choices from it with the
// functions here. A peer therefore commits before anything that decides
// whether its result will be checked exists.

// SeedBytes is the length of a draw's seed.
const SeedBytes = 32

// uniform derives a number in [0, n) from seed under a label, so that one
// seed makes independent choices (audit or not, which auditor). The
// modulo bias is below n/2^64.
func uniform(seed []byte, label string, n int) int {
	if n <= 0 {
		panic("verify: uniform over an empty range")
	}
	h := sha256.New()
	h.Write([]byte("scellis/verify/draw/v1\x00"))
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(seed)
	return int(binary.BigEndian.Uint64(h.Sum(nil)[:8]) % uint64(n))
}

// AuditChance is the probability, as 1 in n, that a result of a peer with
// record r is audited: always (n = 1) until the peer is trusted, then 1 in
// p.AuditOneIn.
func AuditChance(r Record, p Params) int {
	if !r.Trusted(p) || p.AuditOneIn <= 1 {
		return 1
	}
	return p.AuditOneIn
}

// ShouldAudit decides from the drawn seed whether the result of a peer
// with record r is re-executed by another peer.
func ShouldAudit(r Record, p Params, seed []byte) bool {
	return uniform(seed, "audit", AuditChance(r, p)) == 0
}

// PickAuditor chooses the peer that re-executes a shard among candidates
// (the caller leaves out the peer being checked and anyone excluded); ""
// when there is none. The choice depends on the seed and the set of
// candidates only, not on their order, so colluding peers cannot arrange
// to audit each other.
func PickAuditor(candidates []string, seed []byte) string {
	if len(candidates) == 0 {
		return ""
	}
	c := slices.Clone(candidates)
	slices.Sort(c)
	c = slices.Compact(c)
	return c[uniform(seed, "auditor", len(c))]
}
