package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Report rules:
//   - a peer reports at most once per shard: the same hash again is a no-op
//     answered like the first time; a different hash is refused;
//   - with a live lease the report is on time; after the peer's lease ended
//     (expired, released, or revoked by a decision) it is late: accepted as
//     an extra replica, never as a replacement;
//   - a peer that never held a lease on the shard is refused;
//   - on an undecided shard every accepted report, late or not, counts
//     toward the decision (see decide); on a decided shard it is recorded
//     and changes nothing: agreeing is an extra (no credit, the receipt is
//     already minted), differing is a loss.

func (m *Machine) report(c ReportResult) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	if !content.IsRef(string(c.Result)) {
		return refuse(badCommand("result hash %q is not a content ref", c.Result))
	}
	j, s, d := m.shard(c.Job, c.Shard)
	if d != nil {
		return refuse(d)
	}
	if prev := s.reportOf(c.Peer); prev != nil {
		if prev.Result == c.Result {
			return Result{Response: reportResponse(j, s, prev)}
		}
		return refuse(diag.New(diag.PoolReportConflict, shardSubject(j, s.Index),
			"%s already reported %s for shard %d and now reports %s", c.Peer, prev.Result.Short(), s.Index, c.Result.Short()).
			WithHelp("a peer reports one result per shard; a program that gives two results is not deterministic"))
	}
	if d := m.checkExcluded(j, s, c.Peer); d != nil {
		return refuse(d)
	}
	now := m.clock(c.Now)
	if d := m.checkReveal(c, j, s, now); d != nil {
		return refuse(d)
	}
	if d := m.checkReportSig(c, j, s); d != nil {
		return refuse(d)
	}
	i, has := s.leaseOf(c.Peer)
	live := has && s.Leases[i].Expiry > now
	if !live && !s.held(c.Peer) {
		return refuse(diag.New(diag.PoolNoLease, shardSubject(j, s.Index),
			"%s reports a result for shard %d but never held a lease on it", c.Peer, s.Index).
			WithHelp("lease work first; the pool accepts results only for shards it handed out"))
	}

	events := m.advance(now)
	if i, has := s.leaseOf(c.Peer); has {
		s.dropLease(i)
	}
	rec := m.peer(c.Peer)
	rec.Reports++
	if !live {
		rec.Late++
	}
	s.Reports = append(s.Reports, report{Peer: c.Peer, Result: c.Result, Late: !live, At: now, Key: c.Key, Sig: bytesClone(c.Sig), Path: bytesClone(c.Path), Cite: cloneCite(c.Cite)})
	rep := &s.Reports[len(s.Reports)-1]
	m.results[c.Result] = append(m.results[c.Result], shardAt{j, s})
	var decision []Event
	switch s.State {
	case StatePending:
		rep.Outcome, decision = m.decide(j, s, now)
	case StateVerified:
		if c.Result == s.Canonical {
			rep.Outcome = OutcomeExtraAgrees
			rec.Extra++
		} else {
			rep.Outcome = OutcomeExtraDisagrees
			rec.Lost++
			rec.Standing = 0
			s.Losers = insertSorted(s.Losers, c.Peer)
		}
		decision = m.judgeExtra(j, s, now)
	case StateUnverified:
		rep.Outcome = OutcomeExtraUnverified
		rec.Inconclusive++
	}
	resp := reportResponse(j, s, rep)
	events = append(events, ResultReported{
		Job: j.ID, Shard: s.Index, Peer: c.Peer, Result: c.Result, Late: rep.Late, Outcome: rep.Outcome,
	})
	events = append(events, decision...)
	return Result{Response: resp, Events: events}
}

func reportResponse(j *jobState, s *shardState, r *report) *ReportResponse {
	return &ReportResponse{Job: j.ID, Shard: s.Index, Peer: r.Peer, Result: r.Result, Late: r.Late, Outcome: r.Outcome}
}

func insertSorted(s []string, v string) []string {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	if i < len(s) && s[i] == v {
		return s
	}
	s = append(s, "")
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
