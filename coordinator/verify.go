package coordinator

import (
	"fmt"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/verify/spot"
)

// The verification rule (first regime: redundant exact match), applied
// after every report counted on an undecided shard. With n reports, r the
// job's replicas and a the job's attempts:
//
//   - verified when some hash h is reported by c ≥ r peers and by a strict
//     majority of the reports (2c > n). At most one hash can hold a strict
//     majority, so the first to reach it is canonical (BOINC's validator).
//     With all reports agreeing this is "r peers report the same hash".
//   - flagged unverified when no sequence of the a-n reports still allowed
//     could verify it: when even if they all agreed with the leading hash
//     (count c), c+(a-n) < r or 2c+(a-n) ≤ n. That includes n = a.
//   - otherwise it stays pending and is leased again (see need).
//
// On verification the agreeing peers are credited the shard's price and
// the others are recorded as losers; a receipt is minted with the command's
// time. On either decision the shard's remaining leases are revoked.

// leadCount is the largest number of reports sharing one hash.
func leadCount(rs []report) int { return spot.Lead(resultsOf(rs)) }

// majority returns the hash held by ≥ r reports and a strict majority
// (spot.Majority: the rule the cheater simulation exercises).
func majority(rs []report, r int) (content.Ref, bool) { return spot.Majority(resultsOf(rs), r) }

func resultsOf(rs []report) []content.Ref {
	out := make([]content.Ref, len(rs))
	for i := range rs {
		out[i] = rs[i].Result
	}
	return out
}

// decide applies the verification rule to s after a counted report and
// returns the report's outcome and the events of the decision.
func (m *Machine) decide(j *jobState, s *shardState, now int64) (Outcome, []Event) {
	if j.Policy.Check != "" {
		return m.decideChecked(j, s, now)
	}
	if adaptive(j) {
		return m.decideAdaptive(j, s, now)
	}
	if s.Canary != "" {
		return m.decideCanary(j, s, now)
	}
	r, a, n := quorumOf(j, s), j.Policy.Attempts, len(s.Reports)
	h, ok := majority(s.Reports, r)
	voiceless := ok && needsVoice(j, s) && !m.vouched(s, h)
	if ok && !voiceless {
		return OutcomeVerified, m.verified(j, s, h, now)
	}
	left, lead := a-n, leadCount(s.Reports)
	if left > 0 && lead+left >= r && 2*lead+left > n {
		return OutcomeCounted, nil
	}
	reason := fmt.Sprintf("no result reached %d agreeing peers and a strict majority within %d attempts", r, a)
	switch {
	case voiceless:
		reason = fmt.Sprintf("%d peers agreed on %s within %d attempts, none of them a member or a volunteer with standing (%d verified results)", lead, h.Short(), a, StandingAfter)
	case left > 0:
		reason = fmt.Sprintf("after %d disagreeing reports no result can reach %d agreeing peers and a strict majority within %d attempts", n, r, a)
	}
	return OutcomeFlagged, m.flag(j, s, now, reason)
}

// flag marks s unverified for reason and revokes its leases.
func (m *Machine) flag(j *jobState, s *shardState, now int64, reason string) []Event {
	s.State, s.DecidedAt = StateUnverified, now
	for _, rep := range s.Reports {
		m.peer(rep.Peer).Inconclusive++
	}
	events := revoke(j, s)
	events = append(events, ShardFlagged{Job: j.ID, Shard: s.Index, Reports: len(s.Reports), Reason: reason})
	return append(events, m.decided(j)...)
}

// verified records h as s's canonical result, credits the agreeing peers,
// records the losers and mints the receipt.
func (m *Machine) verified(j *jobState, s *shardState, h content.Ref, now int64) []Event {
	s.State, s.Canonical, s.DecidedAt = StateVerified, h, now
	s.Agreeing, s.Losers = nil, nil
	for _, rep := range s.Reports {
		if agrees(s, rep, h) {
			s.Agreeing = append(s.Agreeing, rep.Peer)
		} else {
			s.Losers = append(s.Losers, rep.Peer)
		}
	}
	sort.Strings(s.Agreeing)
	sort.Strings(s.Losers)
	for _, p := range s.Agreeing {
		rec := m.peer(p)
		rec.Won++
		rec.Standing++
		rec.WorkUnits = receipt.SatAddUnits(rec.WorkUnits, s.Price)
	}
	for _, p := range s.Losers {
		rec := m.peer(p)
		rec.Lost++
		rec.Standing = 0
	}
	method := s.Method
	if method == "" {
		method = j.Method
	}
	tier, sigs := signaturesOf(j, s)
	rc := m.mint(receipt.Receipt{
		Job: j.ID, Shard: s.ID, ShardIndex: s.Index, Result: h, Peers: s.Agreeing,
		Method: method, WorkUnits: s.Price, PriceBasis: s.PriceBasis, LeaderTime: now,
		Tier: tier, Signatures: sigs, Cites: citesOf(s),
	})
	s.Receipt = rc.Seq
	events := revoke(j, s)
	events = append(events, ShardVerified{
		Job: j.ID, Shard: s.Index, Result: h, Agreeing: clone(s.Agreeing), Losers: clone(s.Losers), Receipt: rc.Seq,
	})
	return append(events, m.decided(j)...)
}

// mint seals r as the next receipt of the chain and appends it. A receipt
// that does not seal is a broken invariant (every field comes from state the
// machine checked), so mint panics rather than let replicas diverge.
func (m *Machine) mint(r receipt.Receipt) *receipt.Receipt {
	var last *receipt.Receipt
	if n := len(m.st.Receipts); n > 0 {
		last = &m.st.Receipts[n-1]
	}
	rc, err := receipt.Mint(last, r)
	if err != nil {
		panic("coordinator: receipt chain: minted receipt does not append: " + err.Error())
	}
	if n := len(m.st.Receipts); n == cap(m.st.Receipts) {
		// Double the capacity: append grows a large slice by a quarter,
		// so each receipt (about 300 bytes) was copied about four times
		// over a long run — a fifth of minting.
		grown := make([]receipt.Receipt, n, 2*n+1024)
		copy(grown, m.st.Receipts)
		m.st.Receipts = grown
	}
	m.st.Receipts = append(m.st.Receipts, rc)
	return &m.st.Receipts[len(m.st.Receipts)-1]
}

// decided counts one more decided shard of j, moves its cursor and, when
// every shard is decided, moves the job on.
func (m *Machine) decided(j *jobState) []Event {
	j.decided++
	for j.cursor < len(j.Shards) && j.Shards[j.cursor].State != StatePending {
		j.cursor++
	}
	if j.decided < len(j.Shards) {
		return nil
	}
	j.State = JobDecided
	v, u := j.counts()
	return []Event{AllShardsDecided{Job: j.ID, Verified: v, Unverified: u}}
}

// counts returns j's verified and unverified shards.
func (j *jobState) counts() (verified, unverified int) {
	for _, s := range j.Shards {
		switch s.State {
		case StateVerified:
			verified++
		case StateUnverified:
			unverified++
		}
	}
	return verified, unverified
}

func clone(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}
