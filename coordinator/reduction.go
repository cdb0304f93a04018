package coordinator

import (
	"github.com/scellis/scellis/content"
)

// The reduction is verified too: once a job is done, a second reducer
// peer (another aggregator node) reduces the same accepted results and
// reports its own hash with ReportReduced. For the replayable tier the two
// hashes must be equal; for the convergent tier (Policy.Check compare) the
// second reducer compared the two reductions within the job's tolerance
// and says so (Within). Either way the check is recorded with the job —
// confirmed or disputed — and never replaces the first reduction: a
// dispute is there for people (scellis job status) to act on, as the
// reduction of accepted results has no third party to out-vote it.

// ReductionCheck is one second reducer's report on a job's reduction.
type ReductionCheck struct {
	Peer    string      `cbor:"peer" json:"peer"`
	Reduced content.Ref `cbor:"reduced" json:"reduced"`
	// Agrees: the hashes are equal, or (convergent) the second reducer
	// found its reduction within the tolerance of the recorded one.
	Agrees bool  `cbor:"agrees" json:"agrees"`
	At     int64 `cbor:"at" json:"at"`
}

// ReductionChecked: a second reducer confirmed or disputed a reduction.
type ReductionChecked struct {
	Job     content.Ref `json:"job"`
	Peer    string      `json:"peer"`
	Reduced content.Ref `json:"reduced"`
	Agrees  bool        `json:"agrees"`
}

func (ReductionChecked) Kind() string         { return "reduction-checked" }
func (e ReductionChecked) JobID() content.Ref { return e.Job }

func (j *jobState) reductionCheckBy(peer string) *ReductionCheck {
	for i := range j.ReductionChecks {
		if j.ReductionChecks[i].Peer == peer {
			return &j.ReductionChecks[i]
		}
	}
	return nil
}

// secondReduction records a reduction reported by a peer other than the
// first reducer of a done job.
func (m *Machine) secondReduction(j *jobState, c ReportReduced) Result {
	now := m.clock(c.Now)
	events := m.advance(now)
	agrees := c.Reduced == j.Reduced || (j.Policy.Check == CheckCompare && c.Within)
	j.ReductionChecks = append(j.ReductionChecks, ReductionCheck{Peer: c.Peer, Reduced: c.Reduced, Agrees: agrees, At: now})
	check := "confirmed"
	if !agrees {
		check = "disputed"
	}
	events = append(events, ReductionChecked{Job: j.ID, Peer: c.Peer, Reduced: c.Reduced, Agrees: agrees})
	return Result{Response: &ReducedResponse{Job: j.ID, Reduced: j.Reduced, Reducer: j.Reducer, Existing: true, Check: check}, Events: events}
}
