package coordinator

import (
	"fmt"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/verify/spot"
)

// Adaptive verification (Policy.Mode "adaptive"): spot checks, canaries and
// replacement, with the decisions taken by package verify.
//
//   - A shard is leased to one peer. Once that peer's commitment is in the
//     log, the leader draws a seed from crypto/rand and proposes DrawAudit;
//     spot.ShouldAudit decides from the seed and the peer's record whether
//     another peer re-executes the shard (always for a peer without a
//     record, one in AuditOneIn for a trusted one), and spot.PickAuditor
//     which peer: only that peer may lease the shard. A peer therefore
//     commits before anything that decides its check exists, and cannot
//     choose its auditor. The reveal opens only after the draw.
//   - Not audited: the peer's result is accepted alone ("spot-checked-
//     alone"). Audited: the exact-quorum rule with the job's replicas
//     decides, as in quorum mode.
//   - Canaries are shards whose answer the planner computed beforehand
//     (SubmitJob.Canaries); they look like any other shard. A report that
//     differs from the known answer is a failed check at once; one that
//     repeats another peer's wrong result is a rubber stamp.
//   - A failed check (spot.Observe) resets the peer's streak, and
//     re-opens its window of recent accepted results (spot.RecheckWindow):
//     each is re-executed by fresh auditors and decided on their reports
//     alone; a result found wrong is replaced, its receipt reversed by a
//     compensating entry and the peers who vouched for it judged in turn.
//     At ExcludeAfter offences the peer is excluded until Readmit.

// Verification modes.
const (
	// ModeQuorum (the default, also ""): every shard needs Replicas
	// agreeing peers.
	ModeQuorum = "quorum"
	// ModeAdaptive: spot checks by reputation, canaries and replacement.
	ModeAdaptive = "adaptive"
)

// Audit states of a shard in adaptive mode.
const (
	auditAlone   = "alone"
	auditAudited = "audited"
)

// Per-shard acceptance methods, recorded on the shard and its receipt.
const (
	MethodSpotAlone   = "spot-checked-alone"
	MethodSpotAudited = "spot-checked-audited-exact"
	MethodCanary      = "canary-audited"
	MethodRechecked   = "re-checked-exact"
)

// SpotParams are the adaptive-replication knobs every replica applies.
// A job may set its own TrustAfter and AuditOneIn (Policy); ExcludeAfter
// and Window are the pool's, since they act on a peer across jobs.
var SpotParams = spot.DefaultParams

// MaxSpotKnob bounds a job's TrustAfter and AuditOneIn.
const MaxSpotKnob = 1000

// spotParams are the knobs that apply to j: its own trust threshold and
// audit rate (the pool's for a job submitted without them), the pool's
// exclusion and window.
func spotParams(j *jobState) spot.Params {
	p := SpotParams
	if j.Policy.TrustAfter > 0 {
		p.TrustAfter = j.Policy.TrustAfter
	}
	if j.Policy.AuditOneIn > 0 {
		p.AuditOneIn = j.Policy.AuditOneIn
	}
	return p
}

// Canary is a shard's known answer, computed by the planner. It is never
// shown to peers.
type Canary struct {
	Shard  int         `cbor:"shard" json:"shard"`
	Result content.Ref `cbor:"result" json:"result"`
}

// DrawAudit carries the leader's randomness for one shard's spot check,
// drawn from crypto/rand after the commitment it decides on was applied.
// It decides whether the latest committed peer's result is audited and, if
// an auditor is needed, which peer. Refused (SC7030) when there is nothing
// to draw for: in particular before the peer's commitment.
type DrawAudit struct {
	Job   content.Ref `cbor:"job" json:"job"`
	Shard int         `cbor:"shard" json:"shard"`
	Seed  []byte      `cbor:"seed" json:"seed"`
	Now   int64       `cbor:"now" json:"now"`
}

// Readmit lifts the exclusion of Peer; only an operator may (By, stamped
// by the server from the caller's certificate).
type Readmit struct {
	Peer     string `cbor:"peer" json:"peer"`
	By       string `cbor:"by" json:"by"`
	Operator bool   `cbor:"operator" json:"operator"`
	Now      int64  `cbor:"now" json:"now"`
}

func (DrawAudit) command() {}
func (Readmit) command()   {}

// DrawResponse answers DrawAudit. It is for the aggregators only: whether
// a shard is audited is never shown to peers.
type DrawResponse struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Audited bool        `json:"audited"`
	Auditor string      `json:"auditor,omitempty"`
}

// ReadmitResponse answers Readmit.
type ReadmitResponse struct {
	Peer PeerRecord `json:"peer"`
}

// AuditDrawn: the leader's draw for a shard was applied (what it decided
// is not streamed).
type AuditDrawn struct {
	Job   content.Ref `json:"job"`
	Shard int         `json:"shard"`
}

// PeerCaught: a peer failed a check (its result differed from the verified
// one, or it approved a result found wrong: a rubber stamp).
type PeerCaught struct {
	Job      content.Ref `json:"job"`
	Shard    int         `json:"shard"`
	Peer     string      `json:"peer"`
	Stamp    bool        `json:"stamp,omitempty"`
	Offences int         `json:"offences"`
	Excluded bool        `json:"excluded,omitempty"`
}

// ShardReopened: an accepted result is re-checked because a peer who
// vouched for it was caught.
type ShardReopened struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Suspect string      `json:"suspect"`
}

// ReceiptReversed: a receipt's result was found wrong on re-check; the
// compensating receipt takes its credit back.
type ReceiptReversed struct {
	Job      content.Ref `json:"job"`
	Shard    int         `json:"shard"`
	Receipt  uint64      `json:"receipt"`
	Reversal uint64      `json:"reversal"`
}

// PeerReadmitted: an operator lifted a peer's exclusion.
type PeerReadmitted struct {
	Peer string `json:"peer"`
	By   string `json:"by"`
}

func (AuditDrawn) Kind() string              { return "audit-drawn" }
func (e AuditDrawn) JobID() content.Ref      { return e.Job }
func (PeerCaught) Kind() string              { return "peer-caught" }
func (e PeerCaught) JobID() content.Ref      { return e.Job }
func (ShardReopened) Kind() string           { return "shard-reopened" }
func (e ShardReopened) JobID() content.Ref   { return e.Job }
func (ReceiptReversed) Kind() string         { return "receipt-reversed" }
func (e ReceiptReversed) JobID() content.Ref { return e.Job }
func (PeerReadmitted) Kind() string          { return "peer-readmitted" }
func (PeerReadmitted) JobID() content.Ref    { return "" }

func adaptive(j *jobState) bool { return j.Policy.Mode == ModeAdaptive }

// replicasOf is how many agreeing reports decide s now.
func replicasOf(j *jobState, s *shardState) int {
	if adaptive(j) && s.Audit != auditAudited && s.Recheck == 0 {
		return 1
	}
	if !adaptive(j) && s.Canary != "" && s.Recheck == 0 {
		return 1 // a quorum job's canary: the known answer is the other voice
	}
	return j.Policy.Replicas
}

// votes are the reports the quorum rule counts on s: during a re-check,
// the fresh ones only (the accepted result's peers are under suspicion).
func votes(s *shardState) []report {
	if s.Recheck > 0 {
		return s.Reports[s.Recheck-1:]
	}
	return s.Reports
}

// drawPending reports whether s waits for a DrawAudit at now: a commitment
// not yet covered by a draw, or an audit that needs a further peer while
// no reserved auditor is on its way.
func drawPending(j *jobState, s *shardState, now int64) bool {
	if !adaptive(j) || s.State != StatePending {
		return false
	}
	if s.Audit != auditAudited {
		return len(s.Commits) > s.Draws
	}
	if need(j, s) <= liveLeases(s, now) {
		return false
	}
	waiting := now < s.AuditorUntil && !taken(s, s.Auditor, now)
	return !waiting
}

// taken reports whether the reserved auditor took its audit: it holds a
// live lease on s, or committed or reported.
func taken(s *shardState, auditor string, now int64) bool {
	if auditor == "" {
		return false
	}
	if i, has := s.leaseOf(auditor); has && s.Leases[i].Expiry > now {
		return true
	}
	return s.commitOf(auditor) != nil || s.reportOf(auditor) != nil
}

func liveLeases(s *shardState, now int64) int {
	n := 0
	for _, l := range s.Leases {
		if l.Expiry > now {
			n++
		}
	}
	return n
}

// PendingDraws lists the shards waiting for the leader's DrawAudit at now.
// The leader proposes one with a fresh crypto/rand seed for each.
func (m *Machine) PendingDraws(now int64) []ShardRef {
	m.mu.RLock()
	defer m.mu.RUnlock()
	now = m.clock(now)
	var out []ShardRef
	for _, j := range m.st.Jobs {
		if j.State != JobRunning || !adaptive(j) {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if drawPending(j, s, now) {
				out = append(out, ShardRef{Job: j.ID, Shard: s.Index})
			}
		}
	}
	return out
}

// auditsWaiting reports whether some adaptive shard is audited and has no
// reserved auditor (none could be drawn, or it let the reservation lapse).
func (m *Machine) auditsWaiting() bool {
	for _, j := range m.st.Jobs {
		if j.State != JobRunning || !adaptive(j) {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if s.State == StatePending && s.Audit == auditAudited && s.Auditor == "" {
				return true
			}
		}
	}
	return false
}

func (m *Machine) draw(c DrawAudit) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	if len(c.Seed) != spot.SeedBytes {
		return refuse(badCommand("a draw's seed is %d bytes, not %d", spot.SeedBytes, len(c.Seed)))
	}
	j, s, d := m.shard(c.Job, c.Shard)
	if d != nil {
		return refuse(d)
	}
	subject := shardSubject(j, s.Index)
	if !adaptive(j) {
		return refuse(badCommand("job %s is not in adaptive mode; its shards are not spot-checked", j.ID.Short()))
	}
	now := m.clock(c.Now)
	if !drawPending(j, s, now) {
		return refuse(diag.New(diag.PoolDrawEarly, subject, "shard %d has nothing to draw for: no commitment since the last draw, no auditor needed, or one reserved", s.Index).
			WithHelp("the leader draws only after a peer's commitment to its result is in the log; a late or repeated draw is dropped"))
	}
	events := m.advance(now)
	if s.Audit != auditAudited {
		primary := s.Commits[len(s.Commits)-1].Peer
		s.Audit = auditAlone
		if spot.ShouldAudit(m.peer(primary).Record, spotParams(j), c.Seed) {
			s.Audit = auditAudited
		}
		s.Draws = len(s.Commits)
	}
	if s.Audit == auditAudited && need(j, s) > len(s.Leases) {
		s.Auditor = spot.PickAuditor(m.auditorCandidates(s), c.Seed)
		s.AuditorUntil = now + j.Policy.LeaseTTL
	}
	events = append(events, AuditDrawn{Job: j.ID, Shard: s.Index})
	return Result{Response: &DrawResponse{Job: j.ID, Shard: s.Index, Audited: s.Audit == auditAudited, Auditor: s.Auditor}, Events: events}
}

// auditorCandidates are the peers that may re-execute s: every peer that
// has asked for work and is not excluded, except those that committed or
// reported on s or hold a lease on it (a lease that lapsed without a
// commitment, a crash, does not disqualify), and those that ask for
// training rounds alone (they would never lease the audit).
func (m *Machine) auditorCandidates(s *shardState) []string {
	var out []string
	for name, p := range m.st.Peers {
		if _, leased := s.leaseOf(name); !p.Excluded && !p.RoundsOnly && !leased && s.commitOf(name) == nil && s.reportOf(name) == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// decideAdaptive applies adaptive mode's rules after a counted report on
// an undecided shard.
func (m *Machine) decideAdaptive(j *jobState, s *shardState, now int64) (Outcome, []Event) {
	if s.Canary != "" && s.Recheck == 0 {
		out, events := m.decideCanary(j, s, now)
		if out == OutcomeCounted {
			// Someone else must run it: through a draw, like an audit.
			s.Audit, s.Auditor, s.AuditorUntil = auditAudited, "", 0
		}
		return out, events
	}
	r := replicasOf(j, s)
	res := resultsOf(votes(s))
	decision, h := spot.Decide(res, r, j.Policy.Attempts)
	switch decision {
	case spot.Pending:
		return OutcomeCounted, nil
	case spot.Flagged:
		var events []Event
		if s.Recheck > 0 {
			events = m.reverse(j, s, now)
		}
		return OutcomeFlagged, append(events, m.flag(j, s, now, fmt.Sprintf("no result reached %d agreeing peers and a strict majority within %d attempts", r, j.Policy.Attempts))...)
	}
	if s.Recheck > 0 {
		return OutcomeVerified, m.rechecked(j, s, h, now)
	}
	s.Method = MethodSpotAlone
	if s.Audit == auditAudited {
		s.Method = MethodSpotAudited
	}
	events := m.verified(j, s, h, now)
	if s.Audit == auditAudited {
		for i := range s.Reports {
			events = append(events, m.judge(j, s, s.Reports[i].Peer, verdictOf(s, i, h), now)...)
		}
	}
	return OutcomeVerified, events
}

// decideCanary decides a canary shard after a report: a report that
// matches the known answer verifies it; one that differs is a failed
// check (spot.Observe: an offence, exclusion at the second), and the
// shard waits for another peer until its attempts run out. Quorum jobs of
// open pools have canaries too (standing.go): there a canary is how a
// fresh volunteer earns standing, and how a liar is caught alone.
func (m *Machine) decideCanary(j *jobState, s *shardState, now int64) (Outcome, []Event) {
	rep := s.Reports[len(s.Reports)-1]
	if rep.Result == s.Canary {
		s.Method = MethodCanary
		events := m.verified(j, s, s.Canary, now)
		return OutcomeVerified, append(events, m.judge(j, s, rep.Peer, spot.Valid, now)...)
	}
	events := m.judge(j, s, rep.Peer, verdictOf(s, len(s.Reports)-1, s.Canary), now)
	if len(s.Reports) >= j.Policy.Attempts {
		return OutcomeFlagged, append(events, m.flag(j, s, now, fmt.Sprintf("no report matched the known answer within %d attempts", j.Policy.Attempts))...)
	}
	return OutcomeCounted, events
}

// rechecked decides a re-checked shard whose fresh reports agreed on h:
// the accepted result is kept, or replaced and its receipt reversed.
func (m *Machine) rechecked(j *jobState, s *shardState, h content.Ref, now int64) []Event {
	fresh := s.Recheck - 1
	prior, vouched := s.Prior, clone(s.Agreeing)
	s.Recheck, s.Prior = 0, ""
	var events []Event
	if h == prior {
		s.State = StateVerified
		events = append(events, ShardVerified{Job: j.ID, Shard: s.Index, Result: h, Agreeing: clone(s.Agreeing), Losers: clone(s.Losers), Receipt: s.Receipt})
		events = append(events, m.decided(j)...)
	} else {
		events = append(events, m.reverse(j, s, now)...)
		s.Method = MethodRechecked
		events = append(events, m.verified(j, s, h, now)...)
		for _, p := range vouched {
			events = append(events, m.judge(j, s, p, spot.Invalid, now)...)
		}
	}
	for i := fresh; i < len(s.Reports); i++ {
		v := spot.Valid
		switch r := s.Reports[i].Result; {
		case r == h:
		case r == prior:
			v = spot.Stamp
		default:
			v = spot.Invalid
		}
		events = append(events, m.judge(j, s, s.Reports[i].Peer, v, now)...)
	}
	return events
}

// verdictOf judges report i of s against the verified result h: a wrong
// result that repeats an earlier report's is a rubber stamp.
func verdictOf(s *shardState, i int, h content.Ref) spot.Verdict {
	r := s.Reports[i].Result
	if r == h {
		return spot.Valid
	}
	for k := 0; k < i; k++ {
		if s.Reports[k].Result == r && s.Reports[k].Peer != s.Reports[i].Peer {
			return spot.Stamp
		}
	}
	return spot.Invalid
}

// judge applies one verdict to peer's record and what follows from it.
func (m *Machine) judge(j *jobState, s *shardState, peer string, v spot.Verdict, now int64) []Event {
	rec := m.peer(peer)
	a := spot.Observe(&rec.Record, v, spotParams(j))
	if v == spot.Valid {
		return nil
	}
	rec.Standing = 0
	events := []Event{PeerCaught{Job: j.ID, Shard: s.Index, Peer: peer, Stamp: v == spot.Stamp, Offences: rec.Offences, Excluded: a.Exclude}}
	if a.Exclude {
		events = append(events, m.revokePeer(peer)...)
	}
	if a.Recheck {
		events = append(events, m.recheckWindow(peer, now)...)
	}
	return events
}

// revokePeer ends an excluded peer's live leases on generic shards and
// its audit reservations (a new auditor is drawn at once).
func (m *Machine) revokePeer(peer string) []Event {
	var events []Event
	for _, j := range m.st.Jobs {
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if s.Peer != "" {
				continue
			}
			if s.Auditor == peer {
				s.Auditor, s.AuditorUntil = "", 0
			}
			if i, has := s.leaseOf(peer); has {
				s.dropLease(i)
				events = append(events, LeaseEnded{Job: j.ID, Shard: s.Index, Peer: peer, Reason: LeaseRevoked})
			}
		}
	}
	return events
}

type shardKey struct {
	j *jobState
	s *shardState
}

// recheckWindow re-opens the caught peer's recent accepted results.
func (m *Machine) recheckWindow(peer string, now int64) []Event {
	rec := m.peer(peer)
	var acc []spot.Accepted[shardKey]
	for _, j := range m.st.Jobs {
		if !adaptive(j) || (j.State != JobRunning && j.State != JobDecided && j.State != JobDone) {
			continue
		}
		for _, s := range j.Shards {
			if s.State == StateVerified && s.Canary == "" && s.Recheck == 0 && contains(s.Agreeing, peer) {
				acc = append(acc, spot.Accepted[shardKey]{Key: shardKey{j, s}, At: s.DecidedAt})
			}
		}
	}
	window := spot.RecheckWindow(acc, rec.SweptAt, SpotParams.Window)
	rec.SweptAt = now
	var events []Event
	for _, a := range window {
		events = append(events, m.reopen(a.Key.j, a.Key.s, peer)...)
	}
	return events
}

// reopen puts a verified shard back to pending for a re-check; its job
// waits for it again (and is reduced again if it was already).
func (m *Machine) reopen(j *jobState, s *shardState, suspect string) []Event {
	s.State = StatePending
	s.Recheck = len(s.Reports) + 1
	s.Prior = s.Canonical
	s.Audit, s.Auditor, s.AuditorUntil = auditAudited, "", 0
	j.decided--
	j.cursor = min(j.cursor, s.Index)
	if j.State != JobRunning {
		j.State, j.Reduced, j.Reducer, j.DoneAt = JobRunning, "", "", 0
	}
	return []Event{ShardReopened{Job: j.ID, Shard: s.Index, Suspect: suspect}}
}

// reverse appends the compensating receipt for s's receipt and takes its
// credit back from the peers it credited.
func (m *Machine) reverse(j *jobState, s *shardState, now int64) []Event {
	if s.Receipt == 0 {
		return nil
	}
	old := m.st.Receipts[s.Receipt-1]
	if old.Seq != s.Receipt {
		panic("coordinator: receipts out of sequence")
	}
	rc := m.mint(receipt.Receipt{
		Job: j.ID, Shard: s.ID, ShardIndex: s.Index, Result: old.Result, Peers: old.Peers,
		Method: receipt.MethodReversal, WorkUnits: old.WorkUnits, PriceBasis: old.PriceBasis, LeaderTime: now, Reverses: old.Seq,
	})
	for _, p := range old.Peers {
		rec := m.peer(p)
		rec.WorkUnits = receipt.SubUnits(rec.WorkUnits, old.WorkUnits)
		rec.Won--
		rec.Standing = max(rec.Standing-1, 0)
	}
	s.Receipt = 0
	return []Event{ReceiptReversed{Job: j.ID, Shard: s.Index, Receipt: old.Seq, Reversal: rc.Seq}}
}

// judgeExtra judges a report on a shard already verified in adaptive mode
// (an auditor that reveals after a canary's primary matched, say).
func (m *Machine) judgeExtra(j *jobState, s *shardState, now int64) []Event {
	if !adaptive(j) {
		return nil
	}
	return m.judge(j, s, s.Reports[len(s.Reports)-1].Peer, verdictOf(s, len(s.Reports)-1, s.Canonical), now)
}

func (m *Machine) readmit(c Readmit) Result {
	if d := firstOf(checkPeer(c.Peer), checkPeer(c.By), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	if !c.Operator {
		return refuse(diag.New(diag.PoolForbidden, c.By, "%s is not an operator; only an operator re-admits an excluded peer", c.By).
			WithHelp("ask an operator of the federation to run scellis pool readmit %s", c.Peer))
	}
	rec := m.st.Peers[c.Peer]
	if rec == nil || !rec.Excluded {
		return refuse(diag.New(diag.PoolNotExcluded, c.Peer, "%s is not excluded", c.Peer).
			WithHelp("scellis pool peers lists each peer's record; only an excluded peer can be re-admitted"))
	}
	m.advance(m.clock(c.Now))
	spot.Readmit(&rec.Record)
	return Result{Response: &ReadmitResponse{Peer: *rec}, Events: []Event{PeerReadmitted{Peer: c.Peer, By: c.By}}}
}

// checkExcluded refuses a commitment or report of an excluded peer on a
// generic shard: its word no longer counts.
func (m *Machine) checkExcluded(j *jobState, s *shardState, peer string) *diag.Diagnostic {
	if rec := m.st.Peers[peer]; rec != nil && rec.Excluded && s.Peer == "" {
		return diag.New(diag.PoolPeerExcluded, shardSubject(j, s.Index), "%s is excluded after %d failed checks; its results no longer count", peer, rec.Failed).
			WithHelp("an operator re-admits a peer with scellis pool readmit %s", peer)
	}
	return nil
}

func contains(s []string, v string) bool {
	i := sort.SearchStrings(s, v)
	return i < len(s) && s[i] == v
}
