package aggregator

import (
	"context"
	"time"

	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
)

// Runs that resume by themselves (issue 30). A run paused by failures
// that heal (coordinator.RetryRound.Heals: its silos could not be reached,
// its secure aggregation lost its sites) waits for its silos, not for a
// person: while this node leads, a pass that finds such a run paused, its
// RetryAt come and as many of its silos alive as a round needs proposes
// ResumeRun{Auto}. The decision reads only replicated state (Heals,
// RetryAt, Resumes: a new leader continues where the old one was) and the
// silos' liveness, which a new leader learns from their polls — a silo it
// has not heard from in its tenure does not count. A paused run costs
// nothing meanwhile: no attempt is planned, no entry written, until the
// silos are back. Each automatic resume of the same round doubles the
// round's backoff once more (retryAttempt), at most a minute: a round that
// fails with its silos alive is tried again in ever longer cycles, never
// in a loop.

// resumeHealed resumes st, a paused run, when it heals by itself, its
// RetryAt has come and enough of its silos are alive. The cheap checks run
// in the pass; the one that needs the run's spec (its cohort minimum), and
// the proposal, in a goroutine that holds the run (activeRuns), like a
// round.
func (n *Node) resumeHealed(ctx context.Context, st coordinator.RunStatus, now int64) {
	if !st.Heals || st.RetryAt > now || len(n.aliveSilos(st.Silos)) < coordinator.MinSites {
		return
	}
	if _, busy := n.activeRuns.LoadOrStore(st.ID, struct{}{}); busy {
		return
	}
	n.done.Add(1)
	go func() {
		defer n.done.Done()
		defer n.activeRuns.Delete(st.ID)
		rc, err := n.loadRun(ctx, st.ID)
		if err != nil {
			return // the spec is not reachable yet: a round would fail on it too
		}
		need := max(coordinator.MinSites, rc.canon.Spec.MinCohort)
		alive := n.aliveSilos(st.Silos)
		if len(alive) < need {
			return
		}
		res, err := n.Apply(ctx, coordinator.ResumeRun{Run: st.ID, Peer: n.Self.Name, Auto: true, Now: time.Now().UnixMilli()})
		switch {
		case err != nil:
			n.log.Debug("resuming a run", "run", st.ID.Short(), "err", err)
		case len(res.Refusal) > 0:
			// A person resumed or cancelled it meanwhile: the next pass
			// sees the new state.
			n.log.Debug("resuming a run refused", "run", st.ID.Short(), "err", res.Refusal)
		default:
			n.log.Info("training run resumed by itself: its silos are alive again", "run", st.ID.Short(), "round", len(st.Models),
				"alive", len(alive), "needed", need, "resumes", st.Resumes+1)
		}
	}()
}

// aliveSilos returns the silos of silos this leader has heard from within
// their lease in its tenure (a silo a child cluster leads: while it hears
// from the child).
func (n *Node) aliveSilos(silos []string) []string {
	var out []string
	for _, s := range silos {
		m, ok := n.fed.Member(s)
		if !ok || m.Role != identity.Silo {
			continue
		}
		who := s
		if m.Cluster != "" {
			who = m.Cluster
		}
		if n.heard(who) {
			out = append(out, s)
		}
	}
	return out
}

// heard reports whether peer polled (or holds a heartbeat) within its
// lease in this tenure. Unlike alive it does not count a peer that a new
// leader has not heard from yet: resuming on a guess would spend the
// round's attempts on silos that may be gone.
func (n *Node) heard(peer string) bool {
	if n.beating(peer) {
		return true
	}
	v, ok := n.seen.Load(peer)
	if !ok {
		return false
	}
	t := v.(time.Time)
	return !t.IsZero() && time.Since(t) < n.siloLease()
}
