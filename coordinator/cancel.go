package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// CancelJob ends a job before it is reduced: its undecided shards are
// flagged, its leases revoked, and no reduction will be accepted. A job
// whose content fails on every peer would otherwise wait for ever. Rounds
// of a training run are ended with the run (StopRun), not one by one.
type CancelJob struct {
	Job  content.Ref `cbor:"job" json:"job"`
	Peer string      `cbor:"peer" json:"peer"` // who cancelled it
	// Operator says Peer is an operator (stamped by the server from the
	// caller's role): operators may cancel any job, anyone else only the
	// jobs they submitted (SC7108).
	Operator bool   `cbor:"operator,omitempty" json:"operator,omitempty"`
	Reason   string `cbor:"reason" json:"reason"`
	Now      int64  `cbor:"now" json:"now"`
}

func (CancelJob) command() {}

// JobCancelled: the job was cancelled (no result will come).
type JobCancelled struct {
	Job    content.Ref `json:"job"`
	Peer   string      `json:"peer"`
	Reason string      `json:"reason"`
}

func (JobCancelled) Kind() string         { return "job-cancelled" }
func (e JobCancelled) JobID() content.Ref { return e.Job }

// CancelResponse answers CancelJob.
type CancelResponse struct {
	Job     content.Ref `json:"job"`
	Flagged []int       `json:"flagged"`
	State   JobState    `json:"state"`
}

// JobCancelledState is a cancelled job's state.
const JobCancelledState JobState = "cancelled"

func (m *Machine) cancel(c CancelJob) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	if len(c.Reason) > maxName*4 {
		return refuse(badCommand("a cancel reason has at most %d bytes", maxName*4))
	}
	j := m.jobs[string(c.Job)]
	if j == nil {
		return refuse(unknownJob(c.Job))
	}
	if d := mayCancel(c.Peer, c.Operator, "job "+j.Name, j.Submitter); d != nil {
		return refuse(d)
	}
	if j.Run != "" && j.Delegated == nil {
		return refuse(diag.New(diag.RunBadRound, "job "+j.Name, "job %s is a round of a training run", j.ID.Short()).
			WithHelp("stop the run instead; its open round ends with it"))
	}
	resp := &CancelResponse{Job: j.ID, Flagged: []int{}, State: j.State}
	switch j.State {
	case JobDone:
		return refuse(diag.New(diag.PoolJobCancelled, "job "+j.Name, "job %s is already done", j.ID.Short()).
			WithHelp("a reduced job cannot be cancelled; its result stands"))
	case JobCancelledState:
		return Result{Response: resp} // a retried cancel
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	reason := "job cancelled by " + c.Peer
	if c.Reason != "" {
		reason += ": " + c.Reason
	}
	for _, s := range j.Shards {
		if s.State != StatePending {
			continue
		}
		s.State, s.DecidedAt = StateUnverified, now
		events = append(events, revoke(j, s)...)
		events = append(events, ShardFlagged{Job: j.ID, Shard: s.Index, Reports: len(s.Reports), Reason: reason})
		m.decided(j)
		resp.Flagged = append(resp.Flagged, s.Index)
	}
	j.State, j.DoneAt = JobCancelledState, now
	resp.State = j.State
	events = append(events, JobCancelled{Job: j.ID, Peer: c.Peer, Reason: c.Reason})
	return Result{Response: resp, Events: events}
}

// mayCancel allows a cancel to an operator and to the submitter of what is
// cancelled; anyone else is refused with SC7108. A job or run with no
// recorded submitter (from before submitters were recorded) can be
// cancelled by operators only.
func mayCancel(peer string, operator bool, subject, submitter string) *diag.Diagnostic {
	if operator || (submitter != "" && peer == submitter) {
		return nil
	}
	owner := "its submitter " + submitter
	if submitter == "" {
		owner = "no recorded submitter"
	}
	return diag.New(diag.PoolForbidden, subject, "%s may not cancel it: it has %s, and %s is not an operator", peer, owner, peer).
		WithHelp("ask the submitter or an operator of the federation to cancel it")
}
