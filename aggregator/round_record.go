package aggregator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
)

// record checks the round's outcome against a peer's (crosscheck.go),
// stores the next model and the round's result document durably, waits
// for the contributors' reports (flagging whoever did not), and reports
// the result's hash for the round job (law 3: hashes only).
func (rr *roundRun) record(ctx context.Context) error {
	n, st, sum := rr.n, rr.st, rr.sum
	nb, err := rr.next.Encode()
	if err != nil {
		return err
	}
	check, err := rr.checkReduction(ctx, nb)
	if err != nil {
		return err
	}
	contributors := slices.Sorted(slices.Values(sum.Contributors))
	var dropped []string
	for _, m := range rr.members {
		if !slices.Contains(contributors, m.ID) {
			dropped = append(dropped, m.ID)
		}
	}
	doc := fl.RoundResult{
		Format: fl.RoundResultFormat, Run: st.ID, Round: rr.r, Job: rr.job, Bundle: rr.bref, Strategy: rr.rc.canon.Strategy,
		Previous: rr.gref, Model: content.Hash(nb), Global: nb, Metrics: rr.metrics, Weight: sum.Weight,
		Participants: contributors, Dropped: dropped, ErrorBound: sum.ErrorBound, SecAggRound: rr.bundle.SecAgg.Round,
		Step: rr.step, Std: rr.std, Absent: slices.Sorted(slices.Values(rr.absentNames)), Check: check,
	}
	for _, p := range contributors {
		if b, ok := rr.bundle.Base[p]; ok {
			if doc.Staleness == nil {
				doc.Staleness = map[string]int{}
			}
			doc.Staleness[p] = b.Staleness
		}
	}
	if doc.Dropped == nil {
		doc.Dropped = []string{}
	}
	db, err := content.Encode(&doc)
	if err != nil {
		return err
	}
	if err := n.storeDurableAll(ctx, nb, db); err != nil {
		return err
	}
	return rr.report(ctx, content.Hash(db), contributors)
}

// report reports the round's result document for its job, once the
// contributors had ReportGrace to report their contribution hashes
// (right after unmasking) and whoever did not is flagged.
func (rr *roundRun) report(ctx context.Context, result content.Ref, contributors []string) error {
	n := rr.n
	n.awaitReports(ctx, rr.job, contributors)
	// Flagging is a log entry on the round's path: only when a shard is
	// left to flag (every silo reported: the job is decided already, and
	// FlagDropped would change nothing).
	if js, err := n.fsm.machine().Job(rr.job); err != nil || js.State == coordinator.JobRunning {
		if err := n.flagDropped(ctx, rr.job, fmt.Sprintf("secure aggregation summed %d of %d silos", len(contributors), len(rr.members))); err != nil {
			return err
		}
	}
	out, err := n.Apply(ctx, coordinator.ReportReduced{Job: rr.job, Peer: n.Self.Name, Reduced: result, Now: time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	if len(out.Refusal) > 0 && !stale(out.Refusal) {
		return fmt.Errorf("report reduced refused: %v", out.Refusal)
	}
	if len(out.Refusal) == 0 {
		n.metrics.rounds.WithLabelValues(rr.step, "reduced").Inc()
		n.metrics.roundTime.WithLabelValues(rr.step).Observe(time.Since(rr.opened).Seconds())
	}
	return nil
}
