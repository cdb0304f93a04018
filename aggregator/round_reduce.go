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
	next, std, err := stepOutcome(ctx, rr.env, rr.strat, &rr.spec, rr.step, rr.global, rr.std, rr.update, rr.metrics, rr.sum)
	switch {
	case err != nil && rr.step == fl.StepStats:
		// A sum of no rows at all fails, and the silos would re-send
		// the same sums (each caches what it released): retrying
		// cannot help.
		return rr.stop("round %d: the feature statistics are unusable: %v", rr.r, err)
	case err != nil:
		return roundFault{rr.job, fmt.Sprintf("round %d: the server step failed: %v", rr.r, err)}
	}
	rr.next, rr.std = next, std
	return nil
}
