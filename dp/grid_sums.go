package dp

import "iter"

// ReleaseSumOnGrid releases the sum of per-record vectors (one silo's
// feature statistics, or its held-out metric sums) with the Gaussian
// mechanism on the secure-aggregation grid, at record level: each record's
// vector is clipped to L2 norm clip and conditionally rounded onto the
// grid of 2^fracBits on its own (GridGaussian with σ 0), so adding or
// removing one record changes the integer sum by at most √Bound() whatever
// the rounding; the sum then gets one draw of exact discrete Gaussian noise
// of scale T (T² ≥ σ²·Bound()) per coordinate. It returns the released
// integers and the mechanism to charge: one Gaussian step with noise
// multiplier sigma and q = 1 (every record took part; nothing was
// sampled). Charge it before releasing y; decode by dividing by
// 2^fracBits.
//
// GridGaussian.Release clips the vector it is given, which suits a whole
// silo's update; a sum over records must be clipped per record instead,
// which is why this is a function of its own.
func ReleaseSumOnGrid(records iter.Seq[[]float64], dim int, clip, sigma float64, fracBits int, noise *Noise) (y []int64, charge []Mechanism, err error) {
	g := GridGaussian{Clip: clip, Sigma: sigma, FracBits: fracBits, Dim: dim}
	if !(sigma > 0) {
		return nil, nil, g.bad("noise multiplier σ = %v: a release must be noised", sigma)
	}
	if err := g.Validate(); err != nil {
		return nil, nil, err
	}
	if noise == nil {
		noise = NewNoise()
	}
	round := GridGaussian{Clip: clip, FracBits: fracBits, Dim: dim}
	y = make([]int64, dim)
	x := make([]float64, dim)
	for r := range records {
		copy(x, r) // Release clips in place: never the caller's vector
		e, err := round.Release(x, noise)
		if err != nil {
			return nil, nil, err
		}
		for i, v := range e {
			y[i] += v
		}
	}
	t, _ := g.scale()
	addIntGaussian(y, t, noise)
	return y, g.Mechanisms(), nil
}
