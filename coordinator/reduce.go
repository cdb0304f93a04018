package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// reduced records a job's reduced result hash. The reducer peer fetched
// the verified results by their canonical hashes, reduced them in shard
// index order and stored the reduction; the machine keeps only its hash.
func (m *Machine) reduced(c ReportReduced) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	if !content.IsRef(string(c.Reduced)) {
		return refuse(badCommand("reduced hash %q is not a content ref", c.Reduced))
	}
	j := m.jobs[string(c.Job)]
	if j == nil {
		return refuse(unknownJob(c.Job))
	}
	switch j.State {
	case JobRunning:
		v, u := j.counts()
		return refuse(diag.New(diag.PoolJobNotDecided, "job "+j.Name,
			"%d of %d shards are still undecided", len(j.Shards)-v-u, len(j.Shards)).
			WithHelp("reduce once every shard is verified or flagged (the job-decided event)"))
	case JobCancelledState:
		return refuse(diag.New(diag.PoolJobCancelled, "job "+j.Name, "job %s was cancelled; no reduction is accepted", j.ID.Short()))
	case JobAbandoned:
		return refuse(diag.New(diag.RunBadRound, "job "+j.Name, "round job %s was abandoned and its round planned again; no reduction is accepted", j.ID.Short()))
	case JobDone:
		if c.Peer != j.Reducer && j.reductionCheckBy(c.Peer) == nil {
			return m.secondReduction(j, c)
		}
		if j.Reduced != c.Reduced {
			return refuse(diag.New(diag.PoolReducedConflict, "job "+j.Name,
				"%s reports reduced result %s but %s already reported %s",
				c.Peer, c.Reduced.Short(), j.Reducer, j.Reduced.Short()).
				WithHelp("the reduction is replayable, so two reducers must agree: check the reducer content and the results it fetched"))
		}
		return Result{Response: &ReducedResponse{Job: j.ID, Reduced: j.Reduced, Reducer: j.Reducer, Existing: true}}
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	j.State, j.Reduced, j.Reducer, j.DoneAt = JobDone, c.Reduced, c.Peer, now
	events = append(events, JobComplete{Job: j.ID, Reduced: j.Reduced, Reducer: j.Reducer})
	if j.Run != "" {
		events = append(events, m.roundReduced(j, now)...)
	}
	return Result{Response: &ReducedResponse{Job: j.ID, Reduced: j.Reduced, Reducer: j.Reducer}, Events: events}
}
