package fl

import (
	"crypto/sha256"
	"math"
	"slices"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/he"
)

// HERound is how a threshold-he round (RunSpec.Aggregation AggThresholdHE)
// puts the summed vector on the integers: the round's secagg.Params still
// name the members, dimension, clip, weighting and (under DP) the grid;
// HERound adds the he.Params and the fraction bits of the values and of
// the weight coordinate, so that every site's integers stay within the
// per-site bound he.BoundFor(n) and the sum of all n cannot wrap.
type HERound struct {
	Params     he.Params `cbor:"params" json:"params"`
	FracBits   int       `cbor:"frac_bits" json:"frac_bits"`
	WeightBits int       `cbor:"weight_bits,omitempty" json:"weight_bits,omitempty"`
}

// HEClip narrows a step's clip to what a threshold-he round of n sites
// sums on a grid of gridBits fraction bits (at least one when the grid is
// left to NewHERound): the widest c ≤ clip with c·2^f + 1 ≤ he.BoundFor(n).
// The statistics and evaluation steps' range (statsClip, 1e12: sums of
// squares of raw features) is far wider than the ring of ±2^59 holds on
// their DP grid; under DP their values are per-row sums of values within
// ±1 (or the loss cap), so the narrowed clip still admits more than 10^9
// rows per silo for 255 sites. Without DP the widest grid the range fits
// is picked as before.
func HEClip(clip float64, gridBits, n int) float64 {
	fit := math.Floor(math.Ldexp(float64(he.BoundFor(max(n, 1))-1), -max(gridBits, 1)))
	return min(clip, fit)
}

// NewHERound derives a round's threshold-he parameters from its masking
// parameters. The CRS seed is public: SHA-256 of the round ID.
func NewHERound(sp secagg.Params) (*HERound, error) {
	n := len(sp.Members)
	bound := he.BoundFor(n)
	subject := "threshold-he round " + sp.Round
	fitBits := func(x float64) int { // largest f with x·2^f + 1 ≤ bound
		if !(x > 0) || math.IsInf(x, 0) {
			return -1
		}
		f := int(math.Floor(math.Log2(float64(bound-1) / x)))
		for f > 0 && math.Ldexp(x, f)+1 > float64(bound) {
			f--
		}
		return f
	}
	r := &HERound{FracBits: sp.GridBits}
	if r.FracBits == 0 {
		r.FracBits = fitBits(sp.Clip)
	}
	if r.FracBits < 1 || math.Ldexp(sp.Clip, r.FracBits) > float64(bound) {
		return nil, diag.New(diag.SecAggBadParams, subject, "clip %v on a grid of %d fraction bits does not fit the per-site bound %d of %d sites", sp.Clip, r.FracBits, bound, n).
			WithHelp("lower the clip or the grid; threshold-he sums stay within ±2^59")
	}
	dim := sp.Dim
	if sp.Weighted {
		if r.WeightBits = fitBits(sp.MaxWeight); r.WeightBits < 0 {
			return nil, diag.New(diag.SecAggBadParams, subject, "max weight %v does not fit the per-site bound %d", sp.MaxWeight, bound)
		}
		dim++
	}
	seed := sha256.Sum256([]byte("scellis/he-round-seed/v1\x00" + sp.Round))
	r.Params = he.Params{Round: sp.Round, Members: slices.Clone(sp.Members), Threshold: sp.Threshold, Dim: dim, Bound: bound, Seed: seed[:]}
	if err := r.Params.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Encode puts a site's input on the round's integers: values already on
// the grid (encoded, the DP path: the grid is the round's) as they are,
// else the float values with unbiased stochastic rounding; the weight
// follows as the last coordinate on its own grid.
func (r *HERound) Encode(values []float64, encoded []int64, weight float64, weighted bool) ([]int64, error) {
	var y []int64
	if encoded != nil {
		y = slices.Clone(encoded)
	} else {
		var err error
		if y, err = dp.RoundOnGrid(values, r.FracBits, nil); err != nil {
			return nil, err
		}
	}
	if weighted {
		w, err := dp.RoundOnGrid([]float64{weight}, r.WeightBits, nil)
		if err != nil {
			return nil, err
		}
		y = append(y, w[0])
	}
	return y, nil
}

// Result turns the decrypted integer sum into the masking result's form:
// the float sum, the total weight, and the rounding bound (one grid unit
// per contributor, as for masking).
func (r *HERound) Result(res *he.Result, weighted bool) *secagg.Result {
	d := len(res.Sum)
	if weighted {
		d--
	}
	out := &secagg.Result{Round: res.Round, Sum: make([]float64, d), Contributors: res.Contributors, Dropped: res.Dropped,
		ErrorBound: float64(len(res.Contributors)) * math.Ldexp(1, -r.FracBits)}
	for i := range d {
		out.Sum[i] = math.Ldexp(float64(res.Sum[i]), -r.FracBits)
	}
	if weighted {
		out.Weight = math.Ldexp(float64(res.Sum[d]), -r.WeightBits)
	}
	return out
}
