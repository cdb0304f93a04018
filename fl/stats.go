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
// computed from secure sums (Rows is the summed row count they came from,
// after StatsFromSums's floor under DP).
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

// StatsVector is one site's part of the feature-statistics step without
// DP: per feature Σx then Σx² over d's rows (2·d values), and the row
// count. Under DP a site releases StatsRecords instead.
func StatsVector(d *model.Dataset) (sums []float64, rows float64) {
	c := d.Dims()
	sums = make([]float64, 2*c)
	for i := range d.Rows() {
		for j, v := range d.Row(i) {
			sums[j] += v
			sums[c+j] += v * v
		}
	}
	return sums, float64(d.Rows())
}

// Bounds are the public ranges of a run's features under DP: feature j
// lies in [Center_j − Half_j, Center_j + Half_j] (privacy.feature_bounds,
// RunSpec.Bounds).
type Bounds struct {
	Center []float64 // nil: every range centred on 0
	Half   []float64
}

// Len is the number of features the bounds cover.
func (b Bounds) Len() int { return len(b.Half) }

// Scaled is x_j in units of its range: (x − C_j)/H_j clipped to [−1, 1].
func (b Bounds) Scaled(j int, x float64) float64 {
	return max(-1, min(1, (x-b.center(j))/b.Half[j]))
}

func (b Bounds) center(j int) float64 {
	if b.Center == nil {
		return 0
	}
	return b.Center[j]
}

// StatsRecords yields each row's part of the statistics under DP, with
// u_j = b.Scaled(j, x_j) in [−1, 1]: (u_j for every feature, u_j² − ½ for
// every feature, then 1 unless the row count is public) — the per-record
// vectors dp.ReleaseSumOnGrid sums.
//
// The squares are shifted by ½ because adding or removing a row moves the
// sum by the row's whole vector: u² lies in [0, 1], u² − ½ in [−½, ½],
// so each feature contributes at most u² + (u² − ½)² ≤ 5/4 to the
// vector's squared norm instead of u² + u⁴ ≤ 2, and the noise, which is
// calibrated to that norm (StatsSensitivity), is √(1.25d+1)/√(2d+1) ≈ 0.8
// of what the unshifted squares needed, for the same ε. StatsFromSums
// adds ½ back per row; the shift is public, so it costs nothing.
func StatsRecords(d *model.Dataset, b Bounds, publicRows bool) iter.Seq[[]float64] {
	return func(yield func([]float64) bool) {
		c := d.Dims()
		v := make([]float64, StatsDim(c, publicRows))
		for i := range d.Rows() {
			for j, x := range d.Row(i) {
				u := b.Scaled(j, x)
				v[j], v[c+j] = u, u*u-0.5
			}
			if !publicRows {
				v[2*c] = 1
			}
			if !yield(v) {
				return
			}
		}
	}
}

// StatsDim is the length of StatsRecords's vectors for c features: 2c,
// and the count unless it is public.
func StatsDim(c int, publicRows bool) int {
	if publicRows {
		return 2 * c
	}
	return 2*c + 1
}

// StatsSensitivity is the L2 sensitivity of the sum of StatsRecords's
// vectors for c features, √(5c/4 + 1), or √(5c/4) when the row count is
// public and left out of the noised vector.
func StatsSensitivity(c int, publicRows bool) float64 {
	s := 1.25 * float64(c)
	if !publicRows {
		s++
	}
	return math.Sqrt(s)
}

// StatsNoise is the standard deviation of the DP noise on each coordinate
// of the summed statistics of c features from sites sites, each releasing
// at noise multiplier sigma: √sites · σ · StatsSensitivity (every silo adds
// its own full noise, docs/dp.md).
func StatsNoise(sigma float64, c, sites int, publicRows bool) float64 {
	return math.Sqrt(float64(sites)) * sigma * StatsSensitivity(c, publicRows)
}

// StatsDP says how a statistics step's sums were released under DP, for
// StatsFromSums: the run's public ranges, the standard deviation of the
// noise on each summed coordinate in the scaled units (StatsNoise), and
// whether the row count was summed unnoised (privacy.public_rows).
type StatsDP struct {
	Bounds     Bounds
	Noise      float64
	PublicRows bool
}

// StatsFromSums turns the federation's summed statistics into the global
// standardiser: mean Σx/n, population variance Σx²/n − mean². A feature
// whose variance is not positive (constant) gets standard deviation 1, as
// model.FitStandardizer does.
//
// Without DP (rel nil) sums are StatsVector's and rows is exact: fewer
// than one row is an error (no site has any), and summing the same rows
// again cannot change it.
//
// Under DP sums are StatsRecords's (Σu, then Σ(u² − ½)) with noise of
// standard deviation rel.Noise on every coordinate, the count's included
// unless it is public. The released values are post-processed into ones
// that are possible, which costs no privacy, so noise alone never makes
// the step fail and retrying it (the silos re-send the release they paid
// for) is never needed:
//
//   - the row count is at least one and at least twice its noise: a count
//     within two standard deviations of zero cannot be told from it, and
//     dividing by it would multiply the noise of every sum by an arbitrary
//     factor (a negative one flips every mean);
//   - the scaled mean is kept in [−1, 1], where the clipped values lie;
//   - the scaled variance is kept in [floor, 1 − m²] (and in [floor, 1]
//     when the floor is above 1 − m²): 1 − m² is the largest variance of
//     values in [−1, 1] with mean m (Bhatia–Davis), and floor is two
//     standard errors of the variance estimate. A
//     variance that close to zero cannot be told from the noise, and
//     dividing a feature by a noise-sized deviation would blow it up by a
//     random factor from one run to the next: under DP-SGD a blown-up
//     feature dominates every clipped gradient, while an over-estimated
//     spread only shrinks its own feature.
func StatsFromSums(sums []float64, rows float64, rel *StatsDP) (*Standardization, error) {
	if len(sums)%2 != 0 || len(sums) == 0 {
		return nil, fmt.Errorf("fl: feature statistics of odd length %d", len(sums))
	}
	c := len(sums) / 2
	if rel != nil && rel.Bounds.Len() != c {
		return nil, fmt.Errorf("fl: %d feature bounds for %d features", rel.Bounds.Len(), c)
	}
	if rel != nil && !rel.PublicRows {
		rows = max(rows, 1, 2*rel.Noise) // NaN-safe: max of a NaN is NaN, refused below
	}
	if !(rows >= 1) || math.IsInf(rows, 0) {
		return nil, fmt.Errorf("fl: the feature statistics sum %.3g rows; at least one is needed", rows)
	}
	s := &Standardization{Mode: StandardizeFederated, Mean: make([]float64, c), Std: make([]float64, c), Rows: rows}
	for j := range c {
		var m, v float64
		if rel == nil {
			m = sums[j] / rows
			v = sums[c+j]/rows - m*m
		} else {
			m, v = scaledMoments(sums[j], sums[c+j], rows, rel.Noise)
			h := rel.Bounds.Half[j]
			m, v = rel.Bounds.center(j)+h*m, h*h*v
		}
		sd := math.Sqrt(max(v, 0))
		if !(sd > 1e-12*math.Max(1, math.Abs(m))) || math.IsInf(sd, 0) {
			sd = 1
		}
		s.Mean[j], s.Std[j] = m, sd
	}
	return s, nil
}

// scaledMoments is one feature's mean and variance in the bound's units
// from its noised sums s1 = Σu and s2 = Σ(u² − ½) over rows rows, kept
// within what values in [−1, 1] allow (StatsFromSums).
func scaledMoments(s1, s2, rows, noise float64) (m, v float64) {
	m = max(-1, min(1, s1/rows))
	if math.IsNaN(m) {
		m = 0
	}
	// The second moment's error is noise/rows; the mean's enters the
	// variance through m², scaled by 2|m|.
	floor := 2 * (1 + 2*math.Abs(m)) * noise / rows
	upper := 1 - m*m
	v = s2/rows + 0.5 - m*m
	if math.IsNaN(v) {
		v = upper
	}
	// The floor wins over the Bhatia–Davis bound: a mean at ±1 may be
	// noise, and its bound of zero spread would leave the feature in raw
	// units. Neither goes beyond 1, the widest spread in [−1, 1].
	return m, min(1, max(floor, min(upper, v)))
}
