package aggregator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/secagg"
)

// collect waits for the round's secure sum while the silos send their
// parts, excusing at once the silos that decline or lapse (a child
// cluster excuses its sub-cohort's). A sum that fails is retried, unless
// too many silos declined it by their policy or budget: then the run
// stops, for retrying cannot help.
func (rr *roundRun) collect(ctx context.Context) error {
	n, b := rr.n, &rr.bundle
	excuseCtx, stopExcusing := context.WithCancel(ctx)
	var declines sync.Map // silo → its refusal codes
	if b.SubCohorts == nil {
		go n.excuseDecliners(excuseCtx, rr.job, b.SecAgg.Round, &declines)
		go n.excuseLapsed(excuseCtx, b.SecAgg.Round, rr.members)
	}
	var sum *secagg.Result
	var err error
	if rr.recorded {
		sum, rr.transcript, err = n.sagg.WaitRecorded(ctx, b.SecAgg.Round)
	} else {
		sum, err = n.waitSum(ctx, b, rr.job)
	}
	stopExcusing()
	if err == nil {
		rr.sum = sum
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	n.metrics.rounds.WithLabelValues(rr.step, "failed").Inc()
	var declined []string
	declines.Range(func(k, v any) bool {
		declined = append(declined, fmt.Sprintf("%s %s", k, v))
		return true
	})
	slices.Sort(declined)
	if len(rr.members)-len(declined) < max(coordinator.MinSites, rr.spec.MinCohort) {
		return rr.stop("round %d: %d of %d silos declined it by their policy or budget (%s); too few remain: %v",
			rr.r, len(declined), len(rr.members), strings.Join(declined, ", "), err)
	}
	// The model never advances without a sum: the round is tried
	// again (the silos that paid for it re-send the same update).
	return rr.retry("round %d: secure aggregation failed: %v", rr.r, err)
}
