package coordinator

import (
	"fmt"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// A run survives its cluster (law 12): a round attempt that cannot produce
// a model — its secure aggregation failed, too few silos were alive to plan
// it, or its host (the leader that opened it) is gone — is ended with
// RetryRound and the round is planned again as a later job, under a new
// secure-aggregation round ID. Attempts that failed on their own count; a
// run whose round failed MaxAttempts times in a row is paused, never
// stopped, and ResumeRun continues it from its last completed round. A lost
// host does not count: a leader change only delays a run.
//
// A pause whose last failure can heal by itself (RetryRound.Heals: silos
// that could not be reached, a secure aggregation that lost its sites) is
// not the end of the run's progress: the leader resumes it (ResumeRun.Auto)
// once enough of its silos are alive again, never before the run's
// RetryAt. Everything that decision needs is in the replicated state —
// Heals, RetryAt, Resumes — so a new leader takes it alike; only the
// silos' liveness is the leader's own, and a new leader learns it anew.
// A pause that cannot heal (the same sum fails the same way) waits for a
// person, with its diagnostic.

// RetryRound ends the current attempt of a run's next round.
type RetryRound struct {
	Run content.Ref `cbor:"run" json:"run"`
	// Round is the round the attempt was for; a stale proposal (the round
	// completed meanwhile) is refused with SC9303 and changes nothing.
	Round int `cbor:"round" json:"round"`
	// Job is the attempt's round job, if one was submitted; its undecided
	// shards are flagged and it is abandoned (no reduction is accepted).
	Job    content.Ref `cbor:"job,omitempty" json:"job,omitempty"`
	Reason string      `cbor:"reason" json:"reason"`
	// Failed: the attempt failed on its own (it counts toward MaxAttempts);
	// false: its host was lost.
	Failed bool `cbor:"failed" json:"failed"`
	// MaxAttempts pauses the run once this many attempts of the round have
	// failed (0: never). It is the leader's setting, carried in the log so
	// every replica decides alike (law 10).
	MaxAttempts int `cbor:"max_attempts" json:"max_attempts"`
	// RetryAt: the next attempt is not planned before it (the leader's
	// clock plus its backoff); of a run this attempt pauses, it is the
	// earliest automatic resume.
	RetryAt int64 `cbor:"retry_at" json:"retry_at"`
	Now     int64 `cbor:"now" json:"now"`
	// Heals: the attempt failed for a reason that can go away by itself
	// (silos unreachable, a secure aggregation that lost its sites, a
	// blob no node could serve), not one the same inputs repeat (a server
	// step or statistics that fail on the sum). A run it pauses is
	// resumed by the leader once enough silos are alive (ResumeRun.Auto).
	Heals bool `cbor:"heals,omitempty" json:"heals,omitempty"`
}

// ResumeRun continues a paused run from its last completed round.
type ResumeRun struct {
	Run  content.Ref `cbor:"run" json:"run"`
	Peer string      `cbor:"peer" json:"peer"` // who resumed it: its submitter or an operator
	// Operator is stamped by the server from the caller's role.
	Operator bool  `cbor:"operator,omitempty" json:"operator,omitempty"`
	Now      int64 `cbor:"now" json:"now"`
	// Auto: the leader (Peer) resumes a run paused by failures that heal,
	// its silos being alive again. Refused (SC9310) unless the run is
	// paused with Heals and its RetryAt has come. The API never sets it.
	Auto bool `cbor:"auto,omitempty" json:"auto,omitempty"`
}

func (RetryRound) command() {}
func (ResumeRun) command()  {}

// RunPaused is the state of a run whose round failed too often; ResumeRun
// continues it.
const RunPaused RunState = "paused"

// JobAbandoned is the state of a round job whose attempt was ended by
// RetryRound: it is never reduced, and the round is planned again.
const JobAbandoned JobState = "abandoned"

// RetryRoundResponse answers RetryRound.
type RetryRoundResponse struct {
	Run      content.Ref `json:"run"`
	Round    int         `json:"round"`
	Failures int         `json:"failures"` // failed attempts of this round so far
	State    RunState    `json:"state"`
}

// RoundRetried: an attempt of a round ended without a model; the round
// will be planned again (unless the run paused, see RunComplete).
type RoundRetried struct {
	Run      content.Ref `json:"run"`
	Round    int         `json:"round"`
	Job      content.Ref `json:"job,omitempty"`
	Failures int         `json:"failures"`
	Failed   bool        `json:"failed"`
	Reason   string      `json:"reason"`
	RetryAt  int64       `json:"retry_at"`
}

// RunResumed: a paused run continues; Auto when the leader resumed it
// (its silos were alive again), not a person.
type RunResumed struct {
	Run   content.Ref `json:"run"`
	Peer  string      `json:"peer"`
	Round int         `json:"round"`
	Auto  bool        `json:"auto,omitempty"`
}

func (RoundRetried) Kind() string         { return "round-retried" }
func (RunResumed) Kind() string           { return "run-resumed" }
func (e RoundRetried) JobID() content.Ref { return e.Run }
func (e RunResumed) JobID() content.Ref   { return e.Run }

func (m *Machine) retryRound(c RetryRound) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	if len(c.Reason) > maxName*4 {
		c.Reason = c.Reason[:maxName*4]
	}
	r := m.run(c.Run)
	if r == nil {
		return refuse(unknownRun(c.Run))
	}
	subject := fmt.Sprintf("run %s round %d", r.Name, c.Round)
	if r.State != RunRunning {
		return refuse(diag.New(diag.RunNotRunning, subject, "the run is %s", r.State))
	}
	if c.Round != len(r.Models) {
		return refuse(diag.New(diag.RunBadRound, subject, "the next round of this run is %d", len(r.Models)))
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	if c.Job != "" {
		j := m.jobs[string(c.Job)]
		if j == nil || j.Run != r.ID || j.Round != c.Round || len(r.Jobs) == 0 || r.Jobs[len(r.Jobs)-1] != j.ID {
			return refuse(diag.New(diag.RunBadRound, subject, "job %s is not the open attempt of this round", c.Job.Short()))
		}
		switch j.State {
		case JobDone:
			return refuse(diag.New(diag.RunBadRound, subject, "job %s is already reduced", c.Job.Short()))
		case JobRunning, JobDecided:
			reason := "round attempt abandoned: " + c.Reason
			for _, s := range j.Shards {
				if s.State != StatePending {
					continue
				}
				s.State, s.DecidedAt = StateUnverified, now
				events = append(events, revoke(j, s)...)
				events = append(events, ShardFlagged{Job: j.ID, Shard: s.Index, Reports: len(s.Reports), Reason: reason})
				m.decided(j)
			}
			j.State, j.DoneAt = JobAbandoned, now
		}
	}
	if c.Failed {
		r.Failures++
	}
	r.RetryAt = c.RetryAt
	events = append(events, RoundRetried{Run: r.ID, Round: c.Round, Job: c.Job, Failures: r.Failures, Failed: c.Failed, Reason: c.Reason, RetryAt: c.RetryAt})
	if c.Failed && c.MaxAttempts > 0 && r.Failures >= c.MaxAttempts {
		r.State, r.Reason, r.Heals = RunPaused, fmt.Sprintf("round %d failed %d times: %s", c.Round, r.Failures, c.Reason), c.Heals
		events = append(events, RunComplete{Run: r.ID, State: r.State, Model: last(r.Models), Reason: r.Reason})
	}
	return Result{Response: &RetryRoundResponse{Run: r.ID, Round: c.Round, Failures: r.Failures, State: r.State}, Events: events}
}

func (m *Machine) resumeRun(c ResumeRun) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	r := m.run(c.Run)
	if r == nil {
		return refuse(unknownRun(c.Run))
	}
	now := m.clock(c.Now)
	if c.Auto {
		if d := autoResumable(r, now); d != nil {
			return refuse(d)
		}
	} else if d := mayCancel(c.Peer, c.Operator, "run "+r.Name, r.Submitter); d != nil {
		d.Message = strings.Replace(d.Message, "may not cancel it", "may not resume it", 1)
		d.Help = "ask the submitter or an operator of the federation to resume it"
		return refuse(d)
	}
	if r.State != RunPaused {
		help := "only a paused run is resumed; launch a new run (it can warm-start from this one's model)"
		if r.State == RunRunning {
			help = "the run is running; watch it with scellis fl watch"
		}
		return refuse(diag.New(diag.RunNotResumable, "run "+r.Name, "run %s is %s, not paused", r.ID.Short(), r.State).WithHelp("%s", help))
	}
	events := m.advance(now)
	// A person's resume starts the round's backoff afresh; the leader's
	// keeps counting, so a round that keeps failing waits ever longer.
	resumes := 0
	if c.Auto {
		resumes = r.Resumes + 1
	}
	r.State, r.Reason, r.Failures, r.RetryAt, r.Heals, r.Resumes = RunRunning, "", 0, 0, false, resumes
	events = append(events, RunResumed{Run: r.ID, Peer: c.Peer, Round: len(r.Models), Auto: c.Auto})
	return Result{Response: &StopRunResponse{Run: r.ID, State: r.State}, Events: events}
}

// autoResumable refuses the leader's automatic resume of r at now unless r
// is paused by failures that heal and its RetryAt has come: a proposal
// made from a stale view (a person resumed or cancelled the run meanwhile)
// changes nothing.
func autoResumable(r *runState, now int64) *diag.Diagnostic {
	subject := "run " + r.Name
	switch {
	case r.State != RunPaused:
		return diag.New(diag.RunNotResumable, subject, "run %s is %s, not paused", r.ID.Short(), r.State)
	case !r.Heals:
		return diag.New(diag.RunNotResumable, subject, "run %s paused on a failure that does not heal by itself: %s", r.ID.Short(), r.Reason).
			WithHelp("fix the cause, then scellis fl resume it, or cancel it")
	case now < r.RetryAt:
		return diag.New(diag.RunNotResumable, subject, "run %s resumes by itself no sooner than %d ms from now", r.ID.Short(), r.RetryAt-now)
	}
	return nil
}
