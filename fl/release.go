package fl

import (
	"iter"
	"math"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/model"
)

// ReleaseRecordSums is how a silo releases sums over its records besides
// its update — the feature statistics, held-out metric sums — under the
// run's DP: each record's vector (dim values, L2 norm at most
// sensitivity) is rounded onto the secure-aggregation grid of 2^gridBits
// and the integer sum noised there with the discrete Gaussian of noise
// multiplier σ (dp.ReleaseSumOnGrid). It returns the integers to
// secure-aggregate and the mechanism to charge, before they leave (law 6,
// law 11).
func (p Privacy) ReleaseRecordSums(records iter.Seq[[]float64], dim int, sensitivity float64, gridBits int) ([]int64, []dp.Mechanism, error) {
	return dp.ReleaseSumOnGrid(records, dim, sensitivity, p.Sigma, gridBits, p.Noise)
}

// ReleaseStats is a silo's part of the statistics step under DP: the sum
// of StatsRecords of its training rows, scaled by the run's public bounds,
// released by ReleaseRecordSums; then, when the run's row count is public
// (privacy.public_rows), the row count on the same grid, exact and
// unnoised. It returns the 2d+1 integers to secure-aggregate (Σu, Σ(u²−½),
// the count) and the mechanism to charge.
func (p Privacy) ReleaseStats(train *model.Dataset, bounds Bounds, publicRows bool, gridBits int) ([]int64, []dp.Mechanism, error) {
	d := train.Dims()
	y, mechs, err := p.ReleaseRecordSums(StatsRecords(train, bounds, publicRows), StatsDim(d, publicRows), StatsSensitivity(d, publicRows), gridBits)
	if err != nil || !publicRows {
		return y, mechs, err
	}
	rows := math.Ldexp(float64(train.Rows()), gridBits)
	if rows >= 1<<53 {
		return nil, nil, diag.New(diag.ModelNoStatistics, "statistics", "%d rows do not fit the grid of 2^%d", train.Rows(), gridBits)
	}
	return append(y, int64(rows)), mechs, nil
}
