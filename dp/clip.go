package dp

import "math"

// ClipL2 scales v in place so that its Euclidean norm is at most c and returns
// the norm v had before clipping. A vector already inside the ball is left
// untouched. c must be positive and finite; ClipL2 panics otherwise, because a
// non-positive clipping bound voids every sensitivity argument built on it.
//
// The norm is computed with scaling (as BLAS dnrm2 does) so that very large or
// very small components neither overflow nor underflow. A vector containing a
// NaN or an infinity cannot be bounded meaningfully: it is zeroed and the
// returned norm is NaN or +Inf, so the caller can count it as clipped.
func ClipL2(v []float64, c float64) (norm float64) {
	if !(c > 0) || math.IsInf(c, 0) {
		panic("dp: clip bound must be positive and finite")
	}
	norm = L2Norm(v)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		clear(v)
		return norm
	}
	if norm > c {
		// Divide first: v[i]/norm lies in [-1, 1], so neither step can
		// overflow or underflow needlessly whatever the scales of v and c.
		for i := range v {
			v[i] = v[i] / norm * c
		}
		// Rounding can leave the norm a few ulps above c: shrink by a factor
		// whose distance from 1 doubles each round until it is not. This
		// ends within ~60 rounds (at worst with v zeroed).
		for k := 1.0; L2Norm(v) > c; k *= 2 {
			f := math.Max(0, 1-k*0x1p-52)
			for i := range v {
				v[i] *= f
			}
		}
	}
	return norm
}

// L2Norm returns the Euclidean norm of v, computed without intermediate
// overflow or underflow.
func L2Norm(v []float64) float64 {
	scale, ssq := 0.0, 1.0
	for _, x := range v {
		if x == 0 {
			continue
		}
		if math.IsNaN(x) {
			return math.NaN()
		}
		ax := math.Abs(x)
		if math.IsInf(ax, 1) {
			return math.Inf(1)
		}
		if scale < ax {
			r := scale / ax
			ssq = 1 + ssq*r*r
			scale = ax
		} else {
			r := ax / scale
			ssq += r * r
		}
	}
	return scale * math.Sqrt(ssq)
}

// ClipPerExample clips each row of grads (one gradient per example) to L2 norm
// at most c, in place, and returns how many rows were actually scaled down.
// This is the per-example clipping step of DP-SGD: after it, adding or
// removing one example changes the sum of the rows by at most c in L2 norm.
func ClipPerExample(grads [][]float64, c float64) (clipped int) {
	for _, g := range grads {
		if n := ClipL2(g, c); !(n <= c) {
			clipped++
		}
	}
	return clipped
}
