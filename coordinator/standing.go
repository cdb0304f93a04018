package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Standing (issue 34): in an open pool a browser volunteer's result does
// not decide a shard until the volunteer has earned it with verified
// work. Keys are cheap there (a join is about a second of proof of work),
// so a result vouched for only by fresh keys says nothing.
//
//   - A voice is a peer whose report may decide a quorum shard of an open
//     job: a member (any peer that is not a browser volunteer) or a
//     volunteer with standing.
//   - A volunteer has standing once Won ≥ StandingAfter·(1 + Lost +
//     Offences) and it is not excluded: StandingAfter shards verified
//     with it among the agreeing peers, and as many again for every
//     result of it that lost or check it failed. In an open pool every
//     verified shard had a voice among its agreeing peers or matched a
//     canary (the planner's known answer), so standing is earned only by
//     agreeing with someone who already had it, or with a known answer.
//   - Verification (decide): the exact-quorum rule, and at least one of
//     the agreeing peers must be a voice; otherwise the shard stays
//     pending for one more report (need), and is flagged when its
//     attempts run out.
//   - Leasing (eligible): a volunteer without standing is not granted a
//     quorum shard another volunteer without standing holds a live lease
//     on or answered, so fresh keys never fill a shard's replicas between
//     them and waste its attempts.
//
// Canary shards are decided by the known answer alone and open to every
// volunteer: they are how the first volunteers of a pool earn standing.

// StandingAfter is how many verified results a browser volunteer needs
// before its result can decide a shard of an open pool.
const StandingAfter = 3

// needsVoice reports whether s, of j, is decided only with a voice among
// its agreeing peers: a quorum shard (exact match, no canary) of an open
// pool.
func needsVoice(j *jobState, s *shardState) bool {
	return j.Regime == trust.Open && !adaptive(j) && j.Policy.Check == "" && s.Canary == ""
}

// HasStanding reports whether peer's result may decide a shard of an open
// pool: a member always, a browser volunteer once it earned standing.
func (m *Machine) HasStanding(peer string) bool {
	if !receipt.IsVolunteer(peer) {
		return true
	}
	rec := m.st.Peers[peer]
	return rec != nil && !rec.Excluded && rec.Won >= StandingAfter*(1+rec.Lost+rec.Offences)
}

// vouched reports whether a voice reported h on s.
func (m *Machine) vouched(s *shardState, h content.Ref) bool {
	for _, rep := range s.Reports {
		if rep.Result == h && m.HasStanding(rep.Peer) {
			return true
		}
	}
	return false
}

// voicelessOther reports whether a volunteer without standing other than
// peer holds a live lease on s, or committed or reported for it.
func (m *Machine) voicelessOther(s *shardState, peer string, now int64) bool {
	voiceless := func(q string) bool { return q != peer && !m.HasStanding(q) }
	for _, l := range s.Leases {
		if l.Expiry > now && voiceless(l.Peer) {
			return true
		}
	}
	for _, c := range s.Commits {
		if voiceless(c.Peer) {
			return true
		}
	}
	for _, r := range s.Reports {
		if voiceless(r.Peer) {
			return true
		}
	}
	return false
}
