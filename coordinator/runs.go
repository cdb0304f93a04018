package coordinator

import (
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// A training run is a chain of round jobs (law 1: no training-only
// scheduler). The machine records which jobs are the run's rounds, in
// order, and the model each completed round produced; the rounds
// themselves are ordinary jobs whose shards are assigned to the cohort's
// silos, one replica each, since only a silo holds its data.

// MinSites is the smallest cohort of a training run or round: with two
// sites each could subtract its own update from the sum and learn the
// other's.
const MinSites = 3

// MaxRounds bounds one run.
const MaxRounds = 100_000

// StartRun starts a training run over a cohort of silos.
type StartRun struct {
	Run    content.Ref `cbor:"run" json:"run"` // the run spec's hash (its blob)
	Name   string      `cbor:"name" json:"name"`
	Rounds int         `cbor:"rounds" json:"rounds"`
	Silos  []string    `cbor:"silos" json:"silos"` // the cohort, at least MinSites
	// Protections the run declares, checked against the pool's regime:
	// a consortium requires both.
	DP        bool       `cbor:"dp" json:"dp"`
	SecureAgg bool       `cbor:"secure_agg" json:"secure_agg"`
	Dataset   trust.Item `cbor:"dataset" json:"dataset"`
	// Models are the run's classed content: its model and strategy.
	Models []trust.Item `cbor:"models,omitempty" json:"models,omitempty"`
	Regime trust.Regime `cbor:"regime" json:"regime"`
	// Submitter is the member who launched the run (stamped by the server
	// from the caller's certificate); it is not part of the run's plan.
	Submitter string `cbor:"submitter,omitempty" json:"submitter,omitempty"`
	Now       int64  `cbor:"now" json:"now"`
}

// StopRun stops a run before its last round: its owner or an operator
// cancelled it, or a budget or policy makes progress impossible. A running
// or paused run can be stopped; a stopped run stays stopped.
type StopRun struct {
	Run    content.Ref `cbor:"run" json:"run"`
	Reason string      `cbor:"reason" json:"reason"`
	// Peer, when set, is a person cancelling the run (scellis fl cancel):
	// only its submitter or an operator (Operator, stamped by the server
	// from the caller's role) may. The leader's own stops leave it empty.
	Peer     string `cbor:"peer,omitempty" json:"peer,omitempty"`
	Operator bool   `cbor:"operator,omitempty" json:"operator,omitempty"`
	Now      int64  `cbor:"now" json:"now"`
}

// FlagDropped flags every undecided shard of a round job as dropped out of
// the round. The leader proposes it once the round's secure aggregation is
// over (and the contributors had time to report their contribution hashes):
// a silo that dropped out never reports, and the round cannot be reduced
// until each of its shards is decided. The decision is the leader's and
// enters through the log with its Now (law 10); flagged shards earn no
// receipt and count as unverified. On a job that is not running it does
// nothing; on a job that is not a round it is refused.
type FlagDropped struct {
	Job    content.Ref `cbor:"job" json:"job"`
	Reason string      `cbor:"reason" json:"reason"` // optional detail, e.g. the round's outcome
	Now    int64       `cbor:"now" json:"now"`
}

// FlagDroppedResponse answers FlagDropped: the shards flagged by this
// command and the job's state after it.
type FlagDroppedResponse struct {
	Job     content.Ref `json:"job"`
	Flagged []int       `json:"flagged"`
	State   JobState    `json:"state"`
}

// DroppedReason is the reason of the ShardFlagged events of FlagDropped.
const DroppedReason = "dropped out of round"

func (StartRun) command()    {}
func (StopRun) command()     {}
func (FlagDropped) command() {}

// RunState is where a run is.
type RunState string

const (
	RunRunning RunState = "running"
	RunDone    RunState = "done"
	RunStopped RunState = "stopped"
)

type runState struct {
	ID        content.Ref   `cbor:"id"`
	Name      string        `cbor:"name"`
	Plan      content.Ref   `cbor:"plan"`
	Rounds    int           `cbor:"rounds"`
	Silos     []string      `cbor:"silos"`
	StartedAt int64         `cbor:"started_at"`
	Submitter string        `cbor:"submitter,omitempty"` // who launched it
	State     RunState      `cbor:"state"`
	Jobs      []content.Ref `cbor:"jobs,omitempty"`   // round jobs, in order
	Models    []content.Ref `cbor:"models,omitempty"` // model after each completed round
	DoneAt    int64         `cbor:"done_at,omitempty"`
	Reason    string        `cbor:"reason,omitempty"`
	// Failures counts the failed attempts of the next round (RetryRound);
	// RetryAt is when its next attempt may be planned (of a paused run:
	// its earliest automatic resume).
	Failures int   `cbor:"failures,omitempty"`
	RetryAt  int64 `cbor:"retry_at,omitempty"`
	// Heals: the run is paused by a failure that can heal by itself, and
	// the leader resumes it once enough silos are alive (retry.go).
	// Resumes counts the leader's automatic resumes of the next round.
	Heals   bool `cbor:"heals,omitempty"`
	Resumes int  `cbor:"resumes,omitempty"`
}

// RunStatus is a run as the pool sees it.
type RunStatus struct {
	ID        content.Ref   `json:"id"`
	Name      string        `json:"name"`
	Rounds    int           `json:"rounds"`
	Silos     []string      `json:"silos"`
	State     RunState      `json:"state"`
	StartedAt int64         `json:"started_at"`
	Submitter string        `json:"submitter,omitempty"`
	Jobs      []content.Ref `json:"jobs"`
	Models    []content.Ref `json:"models"`
	DoneAt    int64         `json:"done_at,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Failures  int           `json:"failures,omitempty"`
	RetryAt   int64         `json:"retry_at,omitempty"`
	// Heals: paused by failures that can heal; the leader resumes the
	// run once enough of its silos are alive, not before RetryAt.
	Heals   bool `json:"heals,omitempty"`
	Resumes int  `json:"resumes,omitempty"`
}

// StartRunResponse answers StartRun.
type StartRunResponse struct {
	Run      content.Ref `json:"run"`
	Existing bool        `json:"existing"`
}

// StopRunResponse answers StopRun.
type StopRunResponse struct {
	Run   content.Ref `json:"run"`
	State RunState    `json:"state"`
}

// RunStarted, RoundComplete, RunComplete are run events.
type RunStarted struct {
	Run    content.Ref `json:"run"`
	Name   string      `json:"name"`
	Rounds int         `json:"rounds"`
	Silos  []string    `json:"silos"`
}

type RoundComplete struct {
	Run   content.Ref `json:"run"`
	Round int         `json:"round"`
	Job   content.Ref `json:"job"`
	Model content.Ref `json:"model"`
}

type RunComplete struct {
	Run    content.Ref `json:"run"`
	State  RunState    `json:"state"`
	Model  content.Ref `json:"model,omitempty"`
	Reason string      `json:"reason,omitempty"`
}

func (RunStarted) Kind() string    { return "run-started" }
func (RoundComplete) Kind() string { return "round-complete" }
func (RunComplete) Kind() string   { return "run-complete" }

// JobID of a run event is the run's ID, so watchers of a run subscribe to it.
func (e RunStarted) JobID() content.Ref    { return e.Run }
func (e RoundComplete) JobID() content.Ref { return e.Run }
func (e RunComplete) JobID() content.Ref   { return e.Run }

func (m *Machine) run(id content.Ref) *runState {
	for _, r := range m.st.Runs {
		if r.ID == id {
			return r
		}
	}
	return nil
}

func unknownRun(id content.Ref) *diag.Diagnostic {
	return diag.New(diag.RunUnknown, "run "+id.Short(), "no run %s in this pool", id).
		WithHelp("launch it first (scellis fl launch)")
}

func (m *Machine) startRun(c StartRun) Result {
	subject := "run " + c.Name
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	if !content.IsRef(string(c.Run)) || c.Name == "" || len(c.Name) > maxName {
		return refuse(badCommand("a run needs a content ref and a name of 1 to %d bytes", maxName))
	}
	if c.Rounds < 1 || c.Rounds > MaxRounds {
		return refuse(diag.New(diag.RunBadRound, subject, "%d rounds; a run has 1 to %d", c.Rounds, MaxRounds))
	}
	silos := slices.Clone(c.Silos)
	slices.Sort(silos)
	if len(slices.Compact(slices.Clone(silos))) != len(silos) {
		return refuse(badCommand("a silo is named twice in the cohort"))
	}
	for _, s := range silos {
		if d := checkPeer(s); d != nil {
			return refuse(d)
		}
	}
	if len(silos) < MinSites {
		return refuse(diag.New(diag.RunTooFewSites, subject, "the cohort has %d silos; a training run needs at least %d", len(silos), MinSites).
			WithHelp("with two sites each could subtract its own update from the sum and learn the other's; admit at least three"))
	}
	submitter := c.Submitter
	if len(submitter) > maxName {
		return refuse(badCommand("submitter name has more than %d bytes", maxName))
	}
	// The plan is the command without its time and submitter (a
	// relaunch of the same run is the same plan); the time is kept first.
	at := c.Now
	c.Silos, c.Now, c.Submitter = silos, 0, ""
	plan, err := content.HashOf(c)
	if err != nil {
		return refuse(badCommand("run cannot be encoded: %v", err))
	}
	if r := m.run(c.Run); r != nil {
		if r.Plan != plan {
			return refuse(diag.New(diag.RunConflict, subject, "run %s was already started with a different plan", c.Run.Short()).
				WithHelp("launch the changed spec as a new run"))
		}
		return Result{Response: &StartRunResponse{Run: r.ID, Existing: true}}
	}
	req := trust.Request{Subject: subject, Regime: c.Regime, Training: true, DP: c.DP, SecureAgg: c.SecureAgg, Models: c.Models}
	if c.Dataset.Name != "" {
		req.Inputs = []trust.Item{c.Dataset}
	}
	if ds := trust.Admit(m.st.Regime, req); ds.HasErrors() {
		return Result{Refusal: ds}
	}
	now := m.clock(at)
	events := m.advance(now)
	r := &runState{ID: c.Run, Name: c.Name, Plan: plan, Rounds: c.Rounds, Silos: silos, StartedAt: now, Submitter: submitter, State: RunRunning}
	m.st.Runs = append(m.st.Runs, r)
	events = append(events, RunStarted{Run: r.ID, Name: r.Name, Rounds: r.Rounds, Silos: slices.Clone(silos)})
	return Result{Response: &StartRunResponse{Run: r.ID}, Events: events}
}

func (m *Machine) stopRun(c StopRun) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	r := m.run(c.Run)
	if r == nil {
		return refuse(unknownRun(c.Run))
	}
	if c.Peer != "" {
		if d := mayCancel(c.Peer, c.Operator, "run "+r.Name, r.Submitter); d != nil {
			return refuse(d)
		}
	}
	if r.State != RunRunning && r.State != RunPaused {
		return Result{Response: &StopRunResponse{Run: r.ID, State: r.State}}
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	r.State, r.DoneAt, r.Reason, r.Heals = RunStopped, now, c.Reason, false
	events = append(events, RunComplete{Run: r.ID, State: r.State, Model: last(r.Models), Reason: r.Reason})
	return Result{Response: &StopRunResponse{Run: r.ID, State: r.State}, Events: events}
}

func (m *Machine) flagDropped(c FlagDropped) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	if len(c.Reason) > maxName*4 {
		return refuse(badCommand("a drop reason has at most %d bytes", maxName*4))
	}
	j := m.jobs[string(c.Job)]
	if j == nil {
		return refuse(unknownJob(c.Job))
	}
	if j.Run == "" {
		return refuse(diag.New(diag.RunBadRound, "job "+j.Name, "job %s is not a round of a training run", j.ID.Short()).
			WithHelp("only a round's shards are flagged as dropped out; other shards are decided by their reports"))
	}
	resp := &FlagDroppedResponse{Job: j.ID, Flagged: []int{}, State: j.State}
	if j.State != JobRunning {
		return Result{Response: resp}
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	reason := DroppedReason
	if c.Reason != "" {
		reason += ": " + c.Reason
	}
	for _, s := range j.Shards {
		if s.State != StatePending {
			continue
		}
		s.State, s.DecidedAt = StateUnverified, now
		for _, rep := range s.Reports {
			m.peer(rep.Peer).Inconclusive++
		}
		events = append(events, revoke(j, s)...)
		events = append(events, ShardFlagged{Job: j.ID, Shard: s.Index, Reports: len(s.Reports), Reason: reason})
		events = append(events, m.decided(j)...)
		resp.Flagged = append(resp.Flagged, s.Index)
	}
	resp.State = j.State
	return Result{Response: resp, Events: events}
}

func last(refs []content.Ref) content.Ref {
	if len(refs) == 0 {
		return ""
	}
	return refs[len(refs)-1]
}

// checkRound checks a SubmitJob that is a round of a run: the run is
// running, the round is the next one, no earlier round job is still open,
// and the shards are one per cohort silo, assigned, one replica each.
func (m *Machine) checkRound(c SubmitJob) *diag.Diagnostic {
	r := m.run(c.Run)
	if r == nil {
		return unknownRun(c.Run)
	}
	subject := fmt.Sprintf("run %s round %d", r.Name, c.Round)
	if r.State != RunRunning {
		return diag.New(diag.RunNotRunning, subject, "the run is %s", r.State)
	}
	if c.Round != len(r.Models) {
		return diag.New(diag.RunBadRound, subject, "the next round of this run is %d", len(r.Models))
	}
	if n := len(r.Jobs); n > 0 {
		if prev := m.jobs[string(r.Jobs[n-1])]; prev != nil && prev.State != JobDone && prev.State != JobAbandoned {
			return diag.New(diag.RunBadRound, subject, "round job %s is still open", prev.ID.Short())
		}
	}
	if c.Policy.Replicas != 1 {
		return diag.New(diag.RunBadRound, subject, "a round's shards have exactly one replica (only the silo holds its data), not %d", c.Policy.Replicas)
	}
	if len(c.Shards) < MinSites {
		return diag.New(diag.RunTooFewSites, subject, "the round has %d sites; a round needs at least %d", len(c.Shards), MinSites).
			WithHelp("with two sites each could subtract its own update from the sum and learn the other's")
	}
	seen := map[string]bool{}
	for _, s := range c.Shards {
		if !slices.Contains(r.Silos, s.Peer) || seen[s.Peer] {
			return diag.New(diag.RunBadRound, subject, "shard %d is assigned to %q, which is not a distinct silo of the run's cohort", s.Index, s.Peer)
		}
		seen[s.Peer] = true
	}
	return nil
}

// roundReduced records the model a completed round produced.
func (m *Machine) roundReduced(j *jobState, now int64) []Event {
	r := m.run(j.Run)
	if r == nil {
		return nil
	}
	r.Models = append(r.Models, j.Reduced)
	r.Failures, r.RetryAt, r.Resumes = 0, 0, 0
	events := []Event{RoundComplete{Run: r.ID, Round: j.Round, Job: j.ID, Model: j.Reduced}}
	if len(r.Models) == r.Rounds && r.State == RunRunning {
		r.State, r.DoneAt = RunDone, now
		events = append(events, RunComplete{Run: r.ID, State: r.State, Model: j.Reduced})
	}
	return events
}

// Runs returns every run.
func (m *Machine) Runs() []RunStatus {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]RunStatus, len(m.st.Runs))
	for i, r := range m.st.Runs {
		out[i] = r.status()
	}
	return out
}

// Run returns one run.
func (m *Machine) Run(id content.Ref) (RunStatus, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r := m.run(id)
	if r == nil {
		return RunStatus{}, unknownRun(id)
	}
	return r.status(), nil
}

func (r *runState) status() RunStatus {
	return RunStatus{
		ID: r.ID, Name: r.Name, Rounds: r.Rounds, Silos: slices.Clone(r.Silos), State: r.State, StartedAt: r.StartedAt, Submitter: r.Submitter,
		Jobs: append([]content.Ref{}, r.Jobs...), Models: append([]content.Ref{}, r.Models...), DoneAt: r.DoneAt, Reason: r.Reason,
		Failures: r.Failures, RetryAt: r.RetryAt, Heals: r.Heals, Resumes: r.Resumes,
	}
}
