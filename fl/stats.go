package fl

import (
	"fmt"
	"iter"
	"math"

	"github.com/scellis/scellis/model"
)

// Standardization is how a run's features are standardised, as it travels
// in round bundles, round results and the model file: the mode, and for
// federated statistics the global per-feature mean and standard deviation
// computed from secure sums (Rows is the summed row count they came from).
type Standardization struct {
	Mode string    `cbor:"mode" json:"mode"`
	Mean []float64 `cbor:"mean,omitempty" json:"mean,omitempty"`
	Std  []float64 `cbor:"std,omitempty" json:"std,omitempty"`
	Rows float64   `cbor:"rows,omitempty" json:"rows,omitempty"`
}

// Standardizer returns the global standardiser, or nil when the mode has
// none (local: each site's own; none: raw features).
func (s *Standardization) Standardizer() *model.Standardizer {
	if s == nil || s.Mode != StandardizeFederated || len(s.Mean) == 0 {
		return nil
	}
	return &model.Standardizer{Mean: s.Mean, Std: s.Std}
}

// StatsVector is one site's part of the feature-statistics step: per
// feature Σx then Σx² over d's rows (2·d values), and the row count.
//
// With bounds (DP on), each value is clipped to [−B_j, B_j] and the sums
// are of x/B_j and (x/B_j)²: every released value of one row lies in
// [−1, 1], so a row moves the released vector by at most √(2d+1) in L2 —
// the sensitivity the step's Gaussian noise is calibrated to, fixed by the
// public bounds rather than by the data. StatsFromSums undoes the scaling.
func StatsVector(d *model.Dataset, bounds []float64) (sums []float64, rows float64) {
	c := d.Dims()
	sums = make([]float64, 2*c)
	for i := range d.Rows() {
		for j, v := range d.Row(i) {
			if bounds != nil {
				v = max(-1, min(1, v/bounds[j]))
			}
			sums[j] += v
			sums[c+j] += v * v
		}
	}
	return sums, float64(d.Rows())
}

// StatsRecords yields each row's part of the statistics under DP:
// (x/B_j for every feature, (x/B_j)² for every feature, 1), every value
// clipped to [−1, 1] — the per-record vectors dp.ReleaseSumOnGrid sums.
func StatsRecords(d *model.Dataset, bounds []float64) iter.Seq[[]float64] {
	return func(yield func([]float64) bool) {
		c := d.Dims()
		v := make([]float64, 2*c+1)
		for i := range d.Rows() {
			for j, x := range d.Row(i) {
				x = max(-1, min(1, x/bounds[j]))
				v[j], v[c+j] = x, x*x
			}
			v[2*c] = 1
			if !yield(v) {
				return
			}
		}
	}
}

// StatsSensitivity is the L2 sensitivity of StatsVector's released values
// (sums and count) with bounds, for c features: √(2c+1).
func StatsSensitivity(c int) float64 { return math.Sqrt(float64(2*c + 1)) }

// StatsFromSums turns the federation's summed statistics into the global
// standardiser: mean Σx/n, population variance Σx²/n − mean². A feature
// whose variance is not positive (constant, or driven below zero by DP
// noise) gets standard deviation 1, as model.FitStandardizer does.
//
// bounds, when set, are the DP bounds StatsVector scaled by, and noise is
// the standard deviation of the DP noise on each summed coordinate in
// those scaled units (√sites · σ · StatsSensitivity; 0 without DP). Under
// DP the scaled mean is kept in [−1, 1] and the scaled variance in
// [floor, 1], where floor is two standard errors of the variance
// estimate: a variance that close to zero cannot be told from the noise,
// and dividing a feature by a noise-sized deviation would blow it up by an
// arbitrary factor from one run to the next. Over-estimating the spread
// only shrinks the feature, which training absorbs. This is
// post-processing of the released sums and costs no privacy.
func StatsFromSums(sums []float64, rows float64, bounds []float64, noise float64) (*Standardization, error) {
	if len(sums)%2 != 0 || len(sums) == 0 {
		return nil, fmt.Errorf("fl: feature statistics of odd length %d", len(sums))
	}
	if bounds != nil && len(bounds) != len(sums)/2 {
		return nil, fmt.Errorf("fl: %d feature bounds for %d features", len(bounds), len(sums)/2)
	}
	if !(rows >= 1) {
		return nil, fmt.Errorf("fl: the feature statistics sum %.3g rows; at least one is needed", rows)
	}
	c := len(sums) / 2
	s := &Standardization{Mode: StandardizeFederated, Mean: make([]float64, c), Std: make([]float64, c), Rows: rows}
	for j := range c {
		b := 1.0
		if bounds != nil {
			b = bounds[j]
		}
		m := b * sums[j] / rows
		v := b*b*sums[c+j]/rows - m*m
		if bounds != nil && noise > 0 {
			ms := max(-1, min(1, sums[j]/rows))
			// The second moment's error is noise/n; the mean's enters
			// the variance through m², scaled by 2|m|.
			floor := 2 * (1 + 2*math.Abs(ms)) * noise / rows
			vs := max(floor, min(1, sums[c+j]/rows-ms*ms))
			m, v = b*ms, b*b*vs
		}
		sd := math.Sqrt(max(v, 0))
		if !(sd > 1e-12*math.Max(1, math.Abs(m))) || math.IsInf(sd, 0) {
			sd = 1
		}
		s.Mean[j], s.Std[j] = m, sd
	}
	return s, nil
}

// StatsNoise is the standard deviation of the DP noise on each coordinate
// of the summed statistics of c features from sites sites, each releasing
// at noise multiplier sigma: √sites · σ · StatsSensitivity(c).
func StatsNoise(sigma float64, c, sites int) float64 {
	return math.Sqrt(float64(sites)) * sigma * StatsSensitivity(c)
}
