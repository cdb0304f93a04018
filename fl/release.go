package fl

import (
	"iter"

	"github.com/scellis/scellis/dp"
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
