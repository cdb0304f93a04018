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
//   - A volunteer has standing once it is not excluded and
//     PeerRecord.Standing ≥ StandingAfter: StandingAfter shards verified
//     with it among the agreeing peers since its last result that lost
//     or check it failed (consecutive, as BOINC's adaptive replication
//     counts them): one lie caught costs all of it. In an open pool every
//     verified shard had a voice among its agreeing peers or matched a
//     canary (the planner's known answer), so standing is earned only by
//     agreeing with someone who already had it, or with a known answer.
//   - Verification (decide): the exact-quorum rule, and at least one of
//     the agreeing peers must be a voice; otherwise the shard stays
//     pending for one more report (need), and is flagged when its
//     attempts run out.
//   - A disagreement raises the bar by one: once a shard of an open pool
//     has two different results, the winner needs Replicas+1 agreeing
//     reports (quorumOf). Otherwise keys that all lie alike win every
//     tie-break one of them is drawn for: honest, liar, liar.
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

// quorumOf is how many agreeing reports decide s, a shard of j decided by
// the exact-quorum rule: the job's replicas, one more on a shard that
// needs a voice and has seen two different results.
func quorumOf(j *jobState, s *shardState) int {
	r := j.Policy.Replicas
	if needsVoice(j, s) {
		for _, rep := range s.Reports[min(1, len(s.Reports)):] {
			if rep.Result != s.Reports[0].Result {
				return r + 1
			}
		}
	}
	return r
}

// hasStanding reports whether peer's result may decide a shard of an open
// pool: a member always, a browser volunteer once it earned standing.
func (m *Machine) hasStanding(peer string) bool {
	if !receipt.IsVolunteer(peer) {
		return true
	}
	rec := m.st.Peers[peer]
	return rec != nil && !rec.Excluded && rec.Standing >= StandingAfter
}

// vouched reports whether a voice reported h on s.
func (m *Machine) vouched(s *shardState, h content.Ref) bool {
	for _, rep := range s.Reports {
		if rep.Result == h && m.hasStanding(rep.Peer) {
			return true
		}
	}
	return false
}

// voicelessOther reports whether a volunteer without standing other than
// peer holds a live lease on s, or committed or reported for it.
func (m *Machine) voicelessOther(s *shardState, peer string, now int64) bool {
	voiceless := func(q string) bool { return q != peer && !m.hasStanding(q) }
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
