package aggregator

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/fl"
)

// reduce turns the sum into the run's next state: the server step's next
// global model (law 7: from the sum and the total weight only), or the
// feature statistics; an evaluation step leaves the model as it is.
func (rr *roundRun) reduce(ctx context.Context) error {
	rr.next = rr.global
	var err error
	switch rr.step {
	case fl.StepStats:
		// Under DP the noised sums are made possible ones (post-processing,
		// fl.StatsFromSums): noise never makes the step fail. What fails is
		// a sum of no rows at all, and the silos would re-send the same
		// sums (each caches what it released): retrying cannot help.
		if rr.std, err = fl.StatsFromSums(rr.update, rr.metrics["rows"], rr.spec.StatsDP(len(rr.sum.Contributors))); err != nil {
			return rr.stop("round %d: the feature statistics are unusable: %v", rr.r, err)
		}
	case fl.StepTrain:
		if rr.next, err = fl.ServerStep(ctx, rr.env, rr.strat, rr.global, rr.update, rr.sum.Weight); err != nil {
			return roundFault{rr.job, fmt.Sprintf("round %d: the server step failed: %v", rr.r, err)}
		}
	}
	return nil
}
