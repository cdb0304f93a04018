package coordinator

import (
	"encoding/hex"
	"slices"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Queries read the state as of the last applied command. They take no
// time argument (except Leasable): a lease shown as live is live as of the
// machine's clock, Now(), which may lag the wall clock.

// Counts summarises a job's shards. Pending shards have no live lease;
// Leased ones are undecided with at least one.
type Counts struct {
	Total      int `json:"total"`
	Pending    int `json:"pending"`
	Leased     int `json:"leased"`
	Verified   int `json:"verified"`
	Unverified int `json:"unverified"`
}

// JobStatus is a job as the pool sees it.
type JobStatus struct {
	ID               content.Ref  `json:"id"`
	Name             string       `json:"name"`
	Bundle           content.Ref  `json:"bundle"`
	Run              content.Ref  `json:"run,omitempty"`
	Round            int          `json:"round,omitempty"`
	Regime           trust.Regime `json:"regime"`
	SecurityCritical bool         `json:"security_critical"`
	// ReadsInputs: the job reads input tables, so no browser volunteer
	// is leased its shards.
	ReadsInputs bool        `json:"reads_inputs,omitempty"`
	Policy      Policy      `json:"policy"`
	Method      string      `json:"method"`
	State       JobState    `json:"state"`
	SubmittedAt int64       `json:"submitted_at"`
	Submitter   string      `json:"submitter,omitempty"`
	Counts      Counts      `json:"counts"`
	Reduced     content.Ref `json:"reduced,omitempty"`
	Reducer     string      `json:"reducer,omitempty"`
	DoneAt      int64       `json:"done_at,omitempty"`
	// ReductionChecks are the second reducers' verdicts on the reduction.
	ReductionChecks []ReductionCheck `json:"reduction_checks,omitempty"`
	// Delegated: the job is a sub-job of a parent cluster's job.
	Delegated *Delegation   `json:"delegated,omitempty"`
	Shards    []ShardStatus `json:"shards,omitempty"` // only from Job
}

// ShardStatus is one shard in detail.
type ShardStatus struct {
	Index      int         `json:"index"`
	ID         content.Ref `json:"id"`
	Price      int64       `json:"price"`
	PriceBasis string      `json:"price_basis"`
	Peer       string      `json:"peer,omitempty"` // the only peer that may lease it, if set
	Via        string      `json:"via,omitempty"`  // the child cluster that may lease it for Peer
	// State is pending, leased, verified or unverified.
	State  ShardState  `json:"state"`
	Leases []LeaseInfo `json:"leases,omitempty"`
	// Commits are the peers that committed to a result, without their
	// commitments; RevealAt is when the reveal opens at the latest.
	Commits  []CommitInfo `json:"commits,omitempty"`
	RevealAt int64        `json:"reveal_at,omitempty"`
	Reports  []ReportInfo `json:"reports,omitempty"`
	// Result is the canonical result hash of a verified shard: what the
	// reducer fetches, in shard-index order.
	Result    content.Ref `json:"result,omitempty"`
	Agreeing  []string    `json:"agreeing,omitempty"`
	Losers    []string    `json:"losers,omitempty"`
	Receipt   uint64      `json:"receipt,omitempty"`
	DecidedAt int64       `json:"decided_at,omitempty"`
	// Method is how a decided shard was accepted (its receipt's method).
	Method string `json:"method,omitempty"`
	// Verdicts are a checked job's verifier verdicts (verdict.go).
	Verdicts []VerdictInfo `json:"verdicts,omitempty"`
}

// VerdictInfo is one recorded verdict.
type VerdictInfo struct {
	Verifier  string      `json:"verifier"`
	Judged    int         `json:"judged"`
	Agreeing  []string    `json:"agreeing,omitempty"`
	Canonical content.Ref `json:"canonical,omitempty"`
	Detail    string      `json:"detail,omitempty"`
	// Sig is the verifier's signature, in hex.
	Sig string `json:"sig,omitempty"`
	At  int64  `json:"at"`
}

// LeaseInfo is a live lease on a shard.
type LeaseInfo struct {
	Peer   string `json:"peer"`
	Expiry int64  `json:"expiry"`
}

// CommitInfo is a peer's commitment on a shard (the commitment itself is
// not shown).
type CommitInfo struct {
	Peer string `json:"peer"`
	At   int64  `json:"at"`
}

// ReportInfo is an accepted report on a shard.
type ReportInfo struct {
	Peer    string      `json:"peer"`
	Result  content.Ref `json:"result"`
	Late    bool        `json:"late"`
	Outcome Outcome     `json:"outcome"`
	At      int64       `json:"at"`
}

// Job returns a job's status with every shard's detail, or an SC7001
// diagnostic for an unknown job.
func (m *Machine) Job(id content.Ref) (JobStatus, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	j := m.jobs[string(id)]
	if j == nil {
		return JobStatus{}, unknownJob(id)
	}
	js := j.status()
	js.Shards = make([]ShardStatus, len(j.Shards))
	for i, s := range j.Shards {
		js.Shards[i] = s.status()
		js.Shards[i].RevealAt = revealAt(j, s)
	}
	return js, nil
}

// HasJob returns nil when the machine holds job id, else the refusal Job
// gives. Unlike Job it copies nothing: the result endpoint asks it on
// every report, and a job's full status is O(shards).
func (m *Machine) HasJob(id content.Ref) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.jobs[string(id)] == nil {
		return unknownJob(id)
	}
	return nil
}

// Jobs returns every job's status without shard detail, in submission order.
func (m *Machine) Jobs() []JobStatus {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]JobStatus, len(m.st.Jobs))
	for i, j := range m.st.Jobs {
		out[i] = j.status()
	}
	return out
}

// brief is a job's status without its counts.
func (j *jobState) brief() JobStatus {
	return JobStatus{
		ID: j.ID, Name: j.Name, Bundle: j.Bundle, Run: j.Run, Round: j.Round, Regime: j.Regime, SecurityCritical: j.SecurityCritical, ReadsInputs: j.ReadsInputs, Policy: j.Policy,
		Method: j.Method, State: j.State, SubmittedAt: j.SubmittedAt, Submitter: j.Submitter,
		Reduced: j.Reduced, Reducer: j.Reducer, DoneAt: j.DoneAt,
		ReductionChecks: slices.Clone(j.ReductionChecks), Delegated: cloneDelegation(j.Delegated),
	}
}

// JobsIn returns the jobs in any of states, in submission order, as Jobs
// does but without their Counts (left zero): a look cheap enough for
// duties that run on every event, such as finding the jobs to reduce,
// where Jobs, which counts every shard of every job ever submitted, costs
// time that grows with the pool's history (about 15 ms at 500 jobs of 200
// shards, twice per event on the leader).
func (m *Machine) JobsIn(states ...JobState) []JobStatus {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := []JobStatus{}
	for _, j := range m.st.Jobs {
		if slices.Contains(states, j.State) {
			out = append(out, j.brief())
		}
	}
	return out
}

func (j *jobState) status() JobStatus {
	js := j.brief()
	js.Counts.Total = len(j.Shards)
	for _, s := range j.Shards {
		switch {
		case s.State == StateVerified:
			js.Counts.Verified++
		case s.State == StateUnverified:
			js.Counts.Unverified++
		case len(s.Leases) > 0:
			js.Counts.Leased++
		default:
			js.Counts.Pending++
		}
	}
	return js
}

func (s *shardState) status() ShardStatus {
	ss := ShardStatus{
		Index: s.Index, ID: s.ID, Price: s.Price, PriceBasis: s.PriceBasis, Peer: s.Peer, Via: s.Via, State: s.State,
		Result: s.Canonical, Agreeing: clone(s.Agreeing), Losers: clone(s.Losers),
		Receipt: s.Receipt, DecidedAt: s.DecidedAt,
	}
	if s.State == StateVerified {
		ss.Method = s.Method
	}
	if s.State == StatePending && len(s.Leases) > 0 {
		ss.State = StateLeased
	}
	for _, l := range s.Leases {
		ss.Leases = append(ss.Leases, LeaseInfo(l))
	}
	for _, c := range s.Commits {
		ss.Commits = append(ss.Commits, CommitInfo{Peer: c.Peer, At: c.At})
	}
	for _, r := range s.Reports {
		ss.Reports = append(ss.Reports, r.info())
	}
	for _, v := range s.Verdicts {
		ss.Verdicts = append(ss.Verdicts, VerdictInfo{v.Verifier, v.Judged, clone(v.Agreeing), v.Canonical, v.Detail, hex.EncodeToString(v.Sig), v.At})
	}
	return ss
}

// ResultUse says where a blob is a reported result: on an undecided shard
// (then only aggregators may read it, law 13), and the jobs whose decided
// shards it was reported on. A blob that is no report's result has the
// zero ResultUse.
type ResultUse struct {
	Undecided bool
	Decided   []ResultJob
}

// ResultJob is a job a decided result belongs to: who may read the result
// depends on its regime and submitter.
type ResultJob struct {
	Job       content.Ref
	Regime    trust.Regime
	Submitter string
}

// ResultUse finds every report of ref, through the machine's index of
// reports by result (results); Decided lists each job once, in the order
// of their first reports of ref.
func (m *Machine) ResultUse(ref content.Ref) ResultUse {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var u ResultUse
	for _, at := range m.results[ref] {
		if at.shard.State == StatePending {
			return ResultUse{Undecided: true}
		}
		if !slices.ContainsFunc(u.Decided, func(r ResultJob) bool { return r.Job == at.job.ID }) {
			u.Decided = append(u.Decided, ResultJob{Job: at.job.ID, Regime: at.job.Regime, Submitter: at.job.Submitter})
		}
	}
	return u
}

// shardAt is one shard of one job (Machine.results).
type shardAt struct {
	job   *jobState
	shard *shardState
}

// indexResults indexes the reports of jobs by result hash.
func indexResults(jobs []*jobState) map[content.Ref][]shardAt {
	idx := map[content.Ref][]shardAt{}
	for _, j := range jobs {
		for _, s := range j.Shards {
			for _, r := range s.Reports {
				idx[r.Result] = append(idx[r.Result], shardAt{j, s})
			}
		}
	}
	return idx
}

// Receipts returns the receipts with Seq > since, in order (since 0: all).
func (m *Machine) Receipts(since uint64) []receipt.Receipt {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if since >= uint64(len(m.st.Receipts)) {
		return []receipt.Receipt{}
	}
	out := make([]receipt.Receipt, 0, uint64(len(m.st.Receipts))-since)
	for _, r := range m.st.Receipts[since:] {
		out = append(out, r.Clone())
	}
	return out
}

// JobReceipts returns the hashes of job's receipts (reversals included),
// in chain order: what Receipts(0) filtered by job gives, without copying
// the whole chain (a reduction lists its job's receipts).
func (m *Machine) JobReceipts(job content.Ref) []content.Ref {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := []content.Ref{}
	for i := range m.st.Receipts {
		if r := &m.st.Receipts[i]; r.Job == job {
			out = append(out, r.Hash)
		}
	}
	return out
}

// Head returns the receipt chain's head: its last Seq and hash, or
// (0, receipt.Genesis). Every replica's head must match after it applied
// the same log.
func (m *Machine) Head() (uint64, content.Ref) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if n := len(m.st.Receipts); n > 0 {
		return m.st.Receipts[n-1].Seq, m.st.Receipts[n-1].Hash
	}
	return 0, receipt.Genesis
}

// Contributions returns each peer's verified work units, computed from the
// receipt chain with receipt.Contributions.
func (m *Machine) Contributions() map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return receipt.Contributions(m.st.Receipts)
}

// Peers returns every peer's record, sorted by name.
func (m *Machine) Peers() []PeerRecord {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]PeerRecord, 0, len(m.st.Peers))
	for _, p := range m.st.Peers {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Peer < out[k].Peer })
	return out
}

// Leases returns peer's live leases, jobs in submission order, shards in
// index order.
func (m *Machine) Leases(peer string) []LeaseGrant {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := []LeaseGrant{}
	for _, j := range m.st.Jobs {
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if i, has := s.leaseOf(peer); has {
				out = append(out, LeaseGrant{Job: j.ID, Shard: s.Index, ShardID: s.ID, Price: s.Price, Expiry: s.Leases[i].Expiry})
			}
		}
	}
	return out
}

// Leasable returns how many shards a Lease by peer at time now would be
// granted if it asked for all of them, without changing anything. A server
// can use it to answer an idle worker without proposing a log entry.
func (m *Machine) Leasable(peer string, now int64) int { return m.LeasableKinds(peer, nil, now) }

// LeasableKinds is Leasable for a Lease that names kinds: a silo asking
// for its rounds is not woken, nor its request written to the log, for
// generic work it would not be granted.
func (m *Machine) LeasableKinds(peer string, kinds Kinds, now int64) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	now = m.clock(now)
	n := 0
	if _, known := m.st.Peers[peer]; !known && kinds.Has(KindGeneric) && m.auditsWaiting() {
		// A peer the pool has not recorded yet must lease once, granted
		// or not, to become a candidate auditor: audits go only to known
		// peers, and an idle poll answered here would never record it.
		return 1
	}
	for _, j := range m.st.Jobs {
		if j.State != JobRunning || !kinds.admits(j) {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if m.eligible(j, s, peer, now) {
				n++
			}
		}
	}
	return n
}

// NextExpiry returns the earliest expiry of a live lease, and false when
// there is none. A server proposes a Tick once the wall clock passes it,
// so that expired leases free their shards (and stream lease-ended events)
// even when no other command arrives.
func (m *Machine) NextExpiry() (int64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	next, ok := int64(0), false
	for _, j := range m.st.Jobs {
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			for _, l := range s.Leases {
				if !ok || l.Expiry < next {
					next, ok = l.Expiry, true
				}
			}
		}
	}
	return next, ok
}

// Now returns the machine's clock: the latest Now of an applied command.
func (m *Machine) Now() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.Now
}

// Regime returns the pool's trust regime.
func (m *Machine) Regime() trust.Regime {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.Regime
}
