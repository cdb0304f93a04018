package coordinator

import (
	"encoding/hex"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Commit–reveal (law 13: nothing undecided is visible). A peer that has
// run a shard first commits to its result with
//
//	Commitment(result, peer, job, shard, nonce)
//
// (CommitResult), keeping its lease, and reveals the result hash and the
// nonce (ReportResult with Nonce) only once the shard's reveal is open:
// when as many peers have committed as the job's policy needs replicas, or
// when the window of one lease TTL after the first commitment has passed,
// or when the shard is already decided. A peer that reads another's result
// before committing can therefore only commit to it blind; and since the
// API shows no member but the aggregators a report's hash or bytes while a
// shard is undecided, there is nothing to read. A reveal that does not
// open the peer's commitment is refused; a peer that never reveals is
// recorded as timed out when its lease expires.
//
// In a machine configured with CommitReveal, a report without an earlier
// commitment is refused (SC7016) on a job of two or more replicas; a
// one-replica shard is decided by its first report, with no second result
// to copy, so its report may come outright. Without it (benchmarks measuring the
// cost), commitments are still accepted and checked when given.

// NonceBytes is the length of a commitment nonce.
const NonceBytes = 32

// CommitResult commits Peer to a result for one shard without revealing
// it. Accepted from a peer that holds (or held) a lease on the shard; the
// lease stays live. Repeating it is a no-op; a different commitment is
// refused (SC7008).
type CommitResult struct {
	Peer       string      `cbor:"peer" json:"peer"`
	Job        content.Ref `cbor:"job" json:"job"`
	Shard      int         `cbor:"shard" json:"shard"`
	Commitment content.Ref `cbor:"commitment" json:"commitment"`
	Now        int64       `cbor:"now" json:"now"`
}

func (CommitResult) command() {}

// CommitResponse answers CommitResult: how many peers have committed on
// the shard, whether the reveal is open and, if not, the time (unix ms) at
// which it opens at the latest.
type CommitResponse struct {
	Job      content.Ref `json:"job"`
	Shard    int         `json:"shard"`
	Commits  int         `json:"commits"`
	Reveal   bool        `json:"reveal"`
	RevealAt int64       `json:"reveal_at"`
}

// ResultCommitted: a peer committed to a result (the commitment itself is
// not streamed).
type ResultCommitted struct {
	Job   content.Ref `json:"job"`
	Shard int         `json:"shard"`
	Peer  string      `json:"peer"`
}

func (ResultCommitted) Kind() string         { return "result-committed" }
func (e ResultCommitted) JobID() content.Ref { return e.Job }

type commitment struct {
	Peer       string      `cbor:"peer"`
	Commitment content.Ref `cbor:"commitment"`
	At         int64       `cbor:"at"`
}

// commitPreimage is what a commitment hashes, in canonical CBOR.
type commitPreimage struct {
	Domain string      `cbor:"domain"`
	Result content.Ref `cbor:"result"`
	Peer   string      `cbor:"peer"`
	Job    content.Ref `cbor:"job"`
	Shard  int         `cbor:"shard"`
	Nonce  []byte      `cbor:"nonce"`
}

// Commitment is H(result ‖ peer ‖ job ‖ shard ‖ nonce): the content hash
// of the canonical encoding of those fields under a domain string. The
// peer's name binds it to one peer, so a commitment copied from another
// peer opens for that peer only.
func Commitment(result content.Ref, peer string, job content.Ref, shard int, nonce []byte) content.Ref {
	h, err := content.HashOf(commitPreimage{Domain: "scellis/commitment/v1", Result: result, Peer: peer, Job: job, Shard: shard, Nonce: nonce})
	if err != nil {
		panic("coordinator: encoding a commitment: " + err.Error())
	}
	return h
}

// ParseNonce decodes a nonce from its hex form.
func ParseNonce(s string) ([]byte, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != NonceBytes {
		return nil, fmt.Errorf("a nonce is %d bytes in lower-case hex", NonceBytes)
	}
	return b, nil
}

func (s *shardState) commitOf(peer string) *commitment {
	for i := range s.Commits {
		if s.Commits[i].Peer == peer {
			return &s.Commits[i]
		}
	}
	return nil
}

// revealAt is when the reveal of s opens at the latest: one lease TTL
// after its first commitment (0 with no commitment).
func revealAt(j *jobState, s *shardState) int64 {
	if len(s.Commits) == 0 {
		return 0
	}
	return s.Commits[0].At + j.Policy.LeaseTTL
}

// revealOpen reports whether peers may reveal their results on s at now.
// In adaptive mode a commitment waits for the leader's draw first (so the
// draw is in the log before any result is), then a shard not audited
// reveals at once, and a re-check's fresh reports too (the accepted
// result they check is public already, and the fresh ones stay hidden
// until the decision, law 13).
func revealOpen(j *jobState, s *shardState, now int64) bool {
	if s.State != StatePending {
		return true
	}
	if adaptive(j) {
		switch {
		case s.Recheck > 0:
			return true
		case s.Audit != auditAudited && len(s.Commits) > s.Draws:
			return false
		case s.Audit == auditAlone:
			return true
		}
	}
	return len(s.Commits) >= replicasOf(j, s) || (len(s.Commits) > 0 && now >= revealAt(j, s))
}

func (m *Machine) commit(c CommitResult) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	if !content.IsRef(string(c.Commitment)) {
		return refuse(badCommand("commitment %q is not a content ref", c.Commitment))
	}
	j, s, d := m.shard(c.Job, c.Shard)
	if d != nil {
		return refuse(d)
	}
	now := m.clock(c.Now)
	resp := func() *CommitResponse {
		return &CommitResponse{Job: j.ID, Shard: s.Index, Commits: len(s.Commits), Reveal: revealOpen(j, s, now), RevealAt: revealAt(j, s)}
	}
	if d := m.checkExcluded(j, s, c.Peer); d != nil {
		return refuse(d)
	}
	if prev := s.commitOf(c.Peer); prev != nil {
		if prev.Commitment == c.Commitment {
			return Result{Response: resp()}
		}
		return refuse(diag.New(diag.PoolReportConflict, shardSubject(j, s.Index),
			"%s already committed to a result for shard %d", c.Peer, s.Index).
			WithHelp("a peer commits to one result per shard; a program that gives two results is not deterministic"))
	}
	if s.reportOf(c.Peer) != nil {
		return refuse(diag.New(diag.PoolReportConflict, shardSubject(j, s.Index),
			"%s already reported its result for shard %d", c.Peer, s.Index).
			WithHelp("commit before reporting, once per shard"))
	}
	if !s.held(c.Peer) {
		return refuse(diag.New(diag.PoolNoLease, shardSubject(j, s.Index),
			"%s commits to a result for shard %d but never held a lease on it", c.Peer, s.Index).
			WithHelp("lease work first; the pool accepts results only for shards it handed out"))
	}
	events := m.advance(now)
	s.Commits = append(s.Commits, commitment{Peer: c.Peer, Commitment: c.Commitment, At: now})
	events = append(events, ResultCommitted{Job: j.ID, Shard: s.Index, Peer: c.Peer})
	return Result{Response: resp(), Events: events}
}

// checkReveal checks a report against the peer's commitment: in a
// commit–reveal pool one is required, and whenever there is one the nonce
// must open it and the shard's reveal must be open.
func (m *Machine) checkReveal(c ReportResult, j *jobState, s *shardState, now int64) *diag.Diagnostic {
	// The subject is formatted only for a refusal: every report passes
	// here, on every replica.
	subject := func() string { return shardSubject(j, s.Index) }
	com := s.commitOf(c.Peer)
	if com == nil {
		// One replica: the first report decides the shard, so there is no
		// other result to copy and nothing to commit to.
		if (m.st.CommitReveal && j.Policy.Replicas > 1) || adaptive(j) {
			return diag.New(diag.PoolNoCommitment, subject(), "%s reports a result for shard %d without having committed to it", c.Peer, s.Index).
				WithHelp("commit to the result first (POST /v1/commits), and reveal it once the shard's reveal is open; workers do this by themselves")
		}
		return nil
	}
	nonce, err := ParseNonce(c.Nonce)
	if err != nil || Commitment(c.Result, c.Peer, j.ID, s.Index, nonce) != com.Commitment {
		return diag.New(diag.PoolRevealMismatch, subject(), "the result and nonce %s reveals for shard %d do not open its commitment", c.Peer, s.Index).
			WithHelp("reveal exactly the result hash and nonce committed to")
	}
	if !revealOpen(j, s, now) {
		return RevealEarly(subject(), s.Index, revealAt(j, s))
	}
	return nil
}

// RevealEarly is the refusal of a reveal before the shard's reveal opens.
func RevealEarly(subject string, shard int, at int64) *diag.Diagnostic {
	return diag.New(diag.PoolRevealEarly, subject, "the reveal of shard %d is not open yet: it opens once as many peers as the job's replicas have committed, at %d (unix ms) at the latest",
		shard, at).WithHelp("wait for the other peers' commitments, or for the window to close, and reveal again")
}

// RevealOpen reports whether peer's reveal on job's shard would be
// accepted at now as far as the reveal window goes (true when there is
// nothing to wait for), and when it opens at the latest. A server answers
// an early reveal from it without a log entry.
func (m *Machine) RevealOpen(job content.Ref, shard int, now int64) (bool, int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	j, s, d := m.shard(job, shard)
	if d != nil {
		return true, 0
	}
	now = m.clock(now)
	return len(s.Commits) == 0 || revealOpen(j, s, now), revealAt(j, s)
}
