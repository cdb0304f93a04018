package aggregator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// plan reads the run and its global model and plans the round: its step,
// its cohort (the run's alive silos, sampled) and the round bundle that
// names them.
func (rr *roundRun) plan(ctx context.Context) error {
	if err := rr.load(ctx); err != nil {
		return err
	}
	if err := rr.sums(ctx); err != nil {
		return err
	}
	if err := rr.cohort(ctx); err != nil {
		return err
	}
	return rr.planBundle(ctx)
}

// load reads the run's spec and strategy and the round's global model:
// the initial one, or the one the previous round stored.
func (rr *roundRun) load(ctx context.Context) error {
	n, r := rr.n, rr.r
	rc, err := n.loadRun(ctx, rr.st.ID)
	if err != nil {
		if _, ok := diag.As(err); ok {
			return rr.stop("round %d cannot be planned: %v", r, err)
		}
		return rr.retry("round %d: the run spec is unavailable: %v", r, err)
	}
	rr.rc, rr.spec = rc, rc.canon.Spec
	rr.env = n.env(rc, rr.st.ID, r)
	rr.step, rr.trainRound = rr.spec.Step(r)
	rr.strat = rc.strat.With(map[string]any{"round": int64(rr.trainRound), "sites": int64(len(rr.st.Silos))})
	if r == 0 {
		rr.global, err = n.initialGlobal(ctx, rr.env, rr.strat, rc)
		if ds, ok := diag.As(err); ok {
			return rr.stop("round 0: %v", ds)
		}
		if rr.spec.StandardizeMode() != fl.StandardizeFederated {
			rr.std = &fl.Standardization{Mode: rr.spec.StandardizeMode()}
		}
	} else {
		var b []byte
		var prev *fl.RoundResult
		if b, err = n.fetchBlob(ctx, rr.st.Models[r-1]); err == nil {
			prev, rr.global, err = fl.DecodeRoundResult(b)
		}
		if prev != nil {
			rr.std, rr.prevModel = prev.Std, prev.Model
		}
	}
	if err != nil {
		return rr.retry("round %d: no global model: %v", r, err)
	}
	if rr.gb, err = rr.global.Encode(); err != nil {
		return rr.stop("round %d: %v", r, err)
	}
	// Stored (with the bundle that names it) before the round job is
	// submitted.
	rr.gref = content.Hash(rr.gb)
	return nil
}

// sums is what the round's step sums (the update's and metrics' lengths)
// and on which grid and range.
func (rr *roundRun) sums(ctx context.Context) error {
	var err error
	rr.dims, rr.metricNames, rr.grid, err = rr.spec.StepSums(ctx, rr.env, rr.strat, rr.global, rr.step)
	if err != nil {
		return rr.stop("round %d: %v", rr.r, err)
	}
	rr.clip = float64(roundClip)
	if rr.step != fl.StepTrain {
		rr.clip = statsClip
	}
	if rr.spec.AggregationMode() == fl.AggThresholdHE {
		// Threshold-he sums on a smaller ring (±2^59): the range is
		// narrowed to what fits n sites on the step's grid.
		rr.clip = fl.HEClip(rr.clip, rr.grid, len(rr.st.Silos))
	}
	return nil
}

// cohort is the round's cohort: the run's silos that are alive (their
// lease poll, the heartbeat, is recent). A silo that is not is left out
// until it polls again, and rejoins at the next round.
func (rr *roundRun) cohort(ctx context.Context) error {
	n, st, r := rr.n, rr.st, rr.r
	var absent []string
	leave := func(s, why string) {
		absent = append(absent, s+why)
		rr.absentNames = append(rr.absentNames, s)
	}
	declinedBefore := n.declinedEarlier(ctx, st, r)
	for _, s := range st.Silos {
		m, ok := n.fed.Member(s)
		codes, declined := declinedBefore[s]
		switch {
		case !ok || m.Role != identity.Silo:
			leave(s, " (no longer a silo of the federation)")
		case declined:
			// A silo that declined an earlier attempt of this round (its
			// policy or budget refused it) would decline again, and counts
			// against the threshold as a dropout: leave it out of the retry.
			leave(s, " (declined this round: "+codes+")")
		// A silo led by a child cluster polls there, not here: it is
		// alive here while its child is (its heartbeat, liveness.go),
		// and the child's round of the sub-cohort leaves it out if it
		// is gone there.
		case m.Cluster == "" && !n.alive(s):
			leave(s, "")
		case m.Cluster != "" && !n.alive(m.Cluster):
			leave(s, fmt.Sprintf(" (its child cluster %s is gone)", m.Cluster))
		default:
			rr.members = append(rr.members, secagg.Member{ID: s, Key: m.PublicKey.Ed25519()})
		}
	}
	need := max(coordinator.MinSites, rr.spec.MinCohort)
	if len(rr.members) >= need {
		return nil
	}
	// Without the silos that declined this round there are too few,
	// with them the attempt would fail the same way: their policy or
	// budget makes progress impossible, as when they decline in it.
	if len(declinedBefore) > 0 && len(rr.members)+len(declinedBefore) >= need {
		var declined []string
		for s, codes := range declinedBefore {
			declined = append(declined, s+" "+codes)
		}
		slices.Sort(declined)
		return rr.stop("round %d: %d silos declined it by their policy or budget (%s); too few remain: %d alive, the round needs %d",
			r, len(declined), strings.Join(declined, ", "), len(rr.members), need)
	}
	if n.newTenure() {
		return errNextPass // the silos may not have found this leader yet
	}
	return rr.retry("round %d: %d of the run's %d silos are alive, the round needs %d; absent: %s",
		r, len(rr.members), len(st.Silos), need, strings.Join(absent, ", "))
}

// planBundle samples the cohort and writes the round bundle: what the
// round sums, from which model, masked or encrypted, in one round or a
// tree of sub-rounds.
func (rr *roundRun) planBundle(ctx context.Context) error {
	n, st, r, spec, step := rr.n, rr.st, rr.r, rr.spec, rr.step
	var err error
	// A training round may sample the alive cohort and give some of its
	// silos only part of their local work (cohort.sample, .stragglers);
	// silos led by child clusters are sampled child by child, so that
	// each sub-cohort keeps the round's minimum (hierCohort).
	sampled, work := spec.RoundCohortOf(st.ID, r, step, n.cohortGroups(rr.members))
	rr.members = slices.DeleteFunc(rr.members, func(m secagg.Member) bool { return !slices.Contains(sampled, m.ID) })
	var bases map[string]fl.Base
	if spec.Buffer > 0 && step == fl.StepTrain {
		if bases, err = n.staleBases(ctx, st, r, rr.gref, sampled); err != nil {
			return rr.retry("round %d: the silos' stale versions cannot be read: %v", r, err)
		}
	}
	rr.bundle = fl.RoundBundle{
		Format: fl.RoundFormat, Run: st.ID, Round: r, Strategy: rr.rc.canon.Strategy, Global: rr.gref, Work: work,
		UpdateDim: rr.dims, Metrics: rr.metricNames, Seed: spec.Seed, Reducer: n.Self.Name,
		Step: step, TrainRound: rr.trainRound, Std: rr.std, Base: bases,
		SecAgg: secagg.Params{
			Round: roundID(st.ID, r, len(st.Jobs)), Members: rr.members, Dim: rr.dims + len(rr.metricNames),
			Threshold: roundThreshold(len(rr.members), spec.MinCohort),
			Clip:      rr.clip, Weighted: true, MaxWeight: roundMaxWeight, GridBits: rr.grid,
			Protocol: secagg.Protocol(spec.Masking), // empty: by cohort size
		},
	}
	if spec.AggregationMode() == fl.AggThresholdHE {
		if rr.bundle.HE, err = fl.NewHERound(rr.bundle.SecAgg); err != nil {
			return rr.stop("round %d: %v", r, err)
		}
	}
	// Silos led by child clusters: a hierarchical round (hier.go).
	byChild, err := n.hierCohort(fmt.Sprintf("run %s round %d", spec.Name, r), sampled, spec.MinCohort)
	if err != nil {
		return rr.stop("%s", err.Error())
	}
	if byChild != nil {
		if rr.parentKey, err = splitRound(&rr.bundle, byChild, spec.MinCohort); err != nil {
			return rr.stop("round %d: %v", r, err)
		}
	}
	return nil
}
