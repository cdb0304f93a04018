package coordinator

import (
	"fmt"
	"slices"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Checked verification: the convergent tier and Freivalds checks. A job
// whose Policy.Check is set is not verified by equal hashes (honest
// convergent replicas differ in the last bits; a Freivalds-checked shard
// runs once). Once a shard has the reports its check needs, it waits for
// a verdict: no further lease is granted (need is 0) until a verifier peer
// — the leader's reducer peer, which may fetch result bytes the
// coordinator never sees — reports a ReportVerdict naming the agreeing
// peers and the canonical result. The verdict then decides:
//
//   - compare: verified when c ≥ r peers agree and they are a strict
//     majority of the judged reports (2c > n), as for exact match; two
//     byte-identical reports need no verdict (equal bytes are within any
//     tolerance). Otherwise more replicas are leased while the attempts
//     allow, and the next verdict judges all reports again.
//   - freivalds: verified when the check passed for one report; a report
//     that failed is a loser and the shard is executed again elsewhere,
//     within the attempts.
//
// The verifier's name and verdict are kept with the shard and appear in
// the job status and result.json.

// Check names.
const (
	CheckCompare   = "compare"
	CheckFreivalds = "freivalds"
)

// maxDetail bounds a verdict's detail text in the replicated state.
const maxDetail = 512

// verdictRecord is a recorded verdict.
type verdictRecord struct {
	Verifier  string      `cbor:"verifier"`
	Key       string      `cbor:"key,omitempty"`
	Judged    int         `cbor:"judged"`
	Agreeing  []string    `cbor:"agreeing,omitempty"`
	Canonical content.Ref `cbor:"canonical,omitempty"`
	Detail    string      `cbor:"detail,omitempty"`
	Sig       []byte      `cbor:"sig,omitempty"`
	At        int64       `cbor:"at"`
}

// methodOf is the method receipts record for a policy: the same strings
// as verify.MethodExact, MethodConvergent and MethodFreivalds.
func methodOf(p Policy) string {
	switch p.Check {
	case CheckCompare:
		return fmt.Sprintf("quorum-%d-convergent(%s)", p.Replicas, p.Tolerance)
	case CheckFreivalds:
		return fmt.Sprintf("freivalds-k%d", p.Rounds)
	}
	return fmt.Sprintf("quorum-%d-exact", p.Replicas)
}

// checkPolicy refuses a malformed check.
func checkPolicy(p Policy) string {
	if p.Check != "" && p.Mode == ModeAdaptive {
		return "a compare or Freivalds check does not combine with adaptive spot checks"
	}
	switch p.Check {
	case "":
		if p.Tolerance != "" || p.Rounds != 0 {
			return "a tolerance or Freivalds rounds without a check"
		}
	case CheckCompare:
		if p.Tolerance == "" || len(p.Tolerance) > maxName || p.Rounds != 0 {
			return "a compare check needs a tolerance (at most 256 bytes) and no Freivalds rounds"
		}
	case CheckFreivalds:
		if p.Rounds < 1 || p.Rounds > 64 || p.Tolerance != "" {
			return fmt.Sprintf("Freivalds rounds %d outside 1 to 64 (or with a tolerance)", p.Rounds)
		}
		if p.Replicas > 1 {
			return "a Freivalds-checked shard runs once: replicas must be 1"
		}
	default:
		return fmt.Sprintf("unknown check %q (want compare or freivalds)", p.Check)
	}
	return ""
}

func (s *shardState) lastVerdict() *verdictRecord {
	if len(s.Verdicts) == 0 {
		return nil
	}
	return &s.Verdicts[len(s.Verdicts)-1]
}

// judged is how many reports the last verdict covered.
func (s *shardState) judged() int {
	if v := s.lastVerdict(); v != nil {
		return v.Judged
	}
	return 0
}

// awaiting reports whether s waits for a verdict: it has reports no
// verdict covered, and as many as its check needs.
func awaiting(j *jobState, s *shardState) bool {
	if j.Policy.Check == "" || s.State != StatePending {
		return false
	}
	n := len(s.Reports)
	if n <= s.judged() {
		return false
	}
	if j.Policy.Check == CheckFreivalds {
		return true
	}
	return n >= s.judged()+needChecked(j, s, true)
}

// needChecked is need for a checked job: further reports that could verify
// s if they all agreed, counting the last verdict's agreeing peers (or,
// before any verdict, assuming the reports so far agree). fresh ignores the
// wait for a verdict.
func needChecked(j *jobState, s *shardState, fresh bool) int {
	if !fresh && awaiting(j, s) {
		return 0
	}
	if j.Policy.Check == CheckFreivalds {
		return 1
	}
	r, n := j.Policy.Replicas, s.judged()
	lead := 0
	if v := s.lastVerdict(); v != nil {
		lead = len(v.Agreeing)
	}
	if s.lastVerdict() == nil {
		return max(r, 1)
	}
	return max(r-lead, n-2*lead+1, 1)
}

// decideChecked is decide for a checked job after a counted report: equal
// hashes verify a compare check at once; anything else waits for a
// verdict.
func (m *Machine) decideChecked(j *jobState, s *shardState, now int64) (Outcome, []Event) {
	if j.Policy.Check == CheckCompare {
		if h, ok := majority(s.Reports, j.Policy.Replicas); ok {
			return OutcomeVerified, m.verified(j, s, h, now)
		}
	}
	if awaiting(j, s) {
		// No lease is granted meanwhile; the shard's other leases stay
		// live, so their reports are counted by the next verdict.
		return OutcomeCounted, []Event{VerdictDue{Job: j.ID, Shard: s.Index, Reports: len(s.Reports)}}
	}
	return OutcomeCounted, nil
}

// agrees reports whether rep counts as agreeing with canonical h: the
// last verdict's agreeing peers for a checked job, equal hashes otherwise.
func agrees(s *shardState, rep report, h content.Ref) bool {
	if v := s.lastVerdict(); v != nil && v.Canonical == h {
		return slices.Contains(v.Agreeing, rep.Peer)
	}
	return rep.Result == h
}

func (m *Machine) verdict(c ReportVerdict) Result {
	if d := firstOf(checkPeer(c.Verifier), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	j, s, d := m.shard(c.Job, c.Shard)
	if d != nil {
		return refuse(d)
	}
	bad := func(format string, args ...any) Result {
		return refuse(diag.New(diag.VerifyBadVerdict, shardSubject(j, c.Shard), format, args...).
			WithHelp("the verifier judges the shard's current reports again (scellis job status shows them)"))
	}
	switch {
	case j.Policy.Check == "":
		return bad("job %s is verified by exact match; it takes no verdicts", j.ID.Short())
	case s.State != StatePending:
		return bad("shard %d is already %s", s.Index, s.State)
	case c.Judged != len(s.Reports) || !awaiting(j, s):
		return bad("the verdict judges %d reports; the shard has %d and does not wait for a verdict on %d", c.Judged, len(s.Reports), c.Judged)
	case len(c.Detail) > maxDetail:
		return bad("verdict detail of %d bytes; at most %d", len(c.Detail), maxDetail)
	case len(c.Sig) > 128:
		return bad("verdict signature of %d bytes", len(c.Sig))
	case len(c.Key) > maxName:
		return bad("verifier key of %d bytes", len(c.Key))
	case j.Policy.Check == CheckFreivalds && len(c.Agreeing) > 1:
		return bad("a Freivalds verdict accepts one execution, not %d", len(c.Agreeing))
	case len(c.Agreeing) > 0 && !content.IsRef(string(c.Canonical)):
		return bad("canonical result %q is not a content ref", c.Canonical)
	case len(c.Agreeing) == 0 && c.Canonical != "":
		return bad("a canonical result with no agreeing peer")
	}
	if !sort.StringsAreSorted(c.Agreeing) || len(slices.Compact(slices.Clone(c.Agreeing))) != len(c.Agreeing) {
		return bad("agreeing peers must be sorted and distinct")
	}
	if s.reportOf(c.Verifier) != nil {
		// A producer judging its own result would vouch for itself.
		return bad("%s reported a result on shard %d and cannot judge it", c.Verifier, s.Index)
	}
	canonicalSeen := len(c.Agreeing) == 0
	for _, p := range c.Agreeing {
		rep := s.reportOf(p)
		if rep == nil {
			return bad("%s has no report on the shard", p)
		}
		canonicalSeen = canonicalSeen || rep.Result == c.Canonical
	}
	if !canonicalSeen {
		return bad("no agreeing peer reported the canonical result %s", c.Canonical.Short())
	}
	if d := m.checkVerdictSig(c, j); d != nil {
		return refuse(d)
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	s.Verdicts = append(s.Verdicts, verdictRecord{
		Verifier: c.Verifier, Key: c.Key, Judged: c.Judged, Agreeing: clone(c.Agreeing), Canonical: c.Canonical,
		Detail: c.Detail, Sig: slices.Clone(c.Sig), At: now,
	})
	r, a, n, lead := j.Policy.Replicas, j.Policy.Attempts, c.Judged, len(c.Agreeing)
	resp := &VerdictResponse{Job: j.ID, Shard: s.Index}
	if lead >= 1 && (j.Policy.Check == CheckFreivalds || (lead >= r && 2*lead > n)) {
		resp.Outcome = OutcomeVerified
		events = append(events, m.verified(j, s, c.Canonical, now)...)
		return Result{Response: resp, Events: events}
	}
	left := a - n
	if left > 0 && (j.Policy.Check == CheckFreivalds || (lead+left >= r && 2*lead+left > n)) {
		resp.Outcome = OutcomeCounted
		return Result{Response: resp, Events: append(events, VerdictRecorded{Job: j.ID, Shard: s.Index, Verifier: c.Verifier, Agreeing: clone(c.Agreeing), Reports: n})}
	}
	s.State, s.DecidedAt = StateUnverified, now
	for _, rep := range s.Reports {
		m.peer(rep.Peer).Inconclusive++
	}
	events = append(events, revoke(j, s)...)
	events = append(events, ShardFlagged{Job: j.ID, Shard: s.Index, Reports: n,
		Reason: fmt.Sprintf("verifier %s: no result reached the check (%s) within %d attempts", c.Verifier, j.Method, a)})
	resp.Outcome = OutcomeFlagged
	return Result{Response: resp, Events: append(events, m.decided(j)...)}
}

// VerdictResponse answers ReportVerdict.
type VerdictResponse struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Outcome Outcome     `json:"outcome"`
}

// VerdictDue: a checked shard has the reports its check needs and waits
// for a verifier peer's verdict.
type VerdictDue struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Reports int         `json:"reports"`
}

// VerdictRecorded: a verdict that did not decide the shard (too few
// agreeing peers); more replicas are leased.
type VerdictRecorded struct {
	Job      content.Ref `json:"job"`
	Shard    int         `json:"shard"`
	Verifier string      `json:"verifier"`
	Agreeing []string    `json:"agreeing,omitempty"`
	Reports  int         `json:"reports"`
}

// VerdictTask is a shard waiting for a verdict, as a verifier needs it:
// the reports to judge, in arrival order.
type VerdictTask struct {
	Job     content.Ref  `json:"job"`
	Shard   int          `json:"shard"`
	Check   string       `json:"check"`
	Judged  int          `json:"judged"`
	Reports []ReportInfo `json:"reports"`
}

// VerdictsDue lists the shards waiting for a verdict, jobs in submission
// order, shards in index order.
func (m *Machine) VerdictsDue() []VerdictTask {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []VerdictTask
	for _, j := range m.st.Jobs {
		if j.Policy.Check == "" || j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if !awaiting(j, s) {
				continue
			}
			t := VerdictTask{Job: j.ID, Shard: s.Index, Check: j.Policy.Check, Judged: len(s.Reports)}
			for _, r := range s.Reports {
				t.Reports = append(t.Reports, r.info())
			}
			out = append(out, t)
		}
	}
	return out
}

func (VerdictDue) Kind() string      { return "verdict-due" }
func (VerdictRecorded) Kind() string { return "verdict-recorded" }

func (e VerdictDue) JobID() content.Ref      { return e.Job }
func (e VerdictRecorded) JobID() content.Ref { return e.Job }
