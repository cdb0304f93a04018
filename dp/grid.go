package dp

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/scellis/scellis/diag"
)

// GridGaussian is the Gaussian mechanism run on the integer grid that
// secure aggregation sums on, so that the released value is an integer and
// no floating-point residual (Mironov 2012) survives into it:
//
//  1. clip the float vector to L2 norm Clip (ClipL2);
//  2. scale it onto the grid, x·2^FracBits (exact: a power of two);
//  3. round it conditionally at random (Kairouz, Liu, Steinke 2021, Alg. 1
//     and Thm 1): each coordinate goes up with probability its fractional
//     part, and the whole rounding is redrawn until the integer vector's
//     squared L2 norm is at most Bound() — an exact integer comparison, so
//     the encoded vector's sensitivity is √Bound() whatever the rounding;
//  4. add independent exact discrete Gaussian noise N_Z(0, T²) to every
//     coordinate, with T the smallest integer such that T² ≥ σ²·Bound().
//
// Adding or removing the vector changes the release by at most √Bound() in
// L2 norm, and the discrete Gaussian with scale T satisfies
// (Δ²/(2T²))-concentrated DP for integer shifts of L2 norm Δ (Canonne,
// Kamath, Steinke 2020, Thm 14), which is the Gaussian mechanism's RDP
// α·Δ²/(2T²) ≤ α/(2σ²). One release is therefore charged as one step of
// the Gaussian mechanism with noise multiplier Sigma and q = 1
// (Mechanisms). Sigma 0 means no noise: only steps 1–3 (the record-level
// path, whose DP-SGD noise was added and charged before).
type GridGaussian struct {
	Clip     float64 // L2 bound of the float vector
	Sigma    float64 // noise multiplier; 0 for rounding only
	FracBits int     // the grid: x is encoded as an integer near x·2^FracBits
	Dim      int     // length of the vector
}

// Limits of the grid mechanism.
const (
	// maxGridT bounds the noise scale T so the sampler's arithmetic stays
	// in 64-bit integers (|Y − T|² and 2T² below 2^63 for |Y| < 2^31).
	maxGridT = 1 << 26
	// maxGridNorm bounds Clip·2^FracBits so squared norms fit in 64 bits.
	maxGridNorm = 1 << 28
	// roundingTries bounds the redraws of the conditional rounding; each
	// succeeds with probability at least 1 − e^(−1/2) ≈ 0.39 (β = e^(−1/2)
	// in KLS Thm 1), so 2000 fail together with probability below 10^−400.
	roundingTries = 2000
	// HeadroomSigmas is how many noise standard deviations the ring's
	// headroom must hold beyond the encoded norm: the chance a discrete
	// Gaussian coordinate exceeds it is below 2·e^(−HeadroomSigmas²/2),
	// about 10^−55 for 16.
	HeadroomSigmas = 16
)

// GridFracBits returns the fraction bits of a grid suited to vectors of dim
// coordinates clipped to L2 norm clip: the smallest f with
// clip·2^f ≥ max(1024, 64·√dim). Rounding then inflates the sensitivity by
// a factor below 1 + 1/1024 + 1/(4·64²), while the noise scale T stays far
// below maxGridT for any σ up to a few hundred.
func GridFracBits(clip float64, dim int) int {
	target := math.Max(1024, 64*math.Sqrt(float64(max(dim, 1))))
	f := int(math.Ceil(math.Log2(target / clip)))
	for math.Ldexp(clip, f) < target {
		f++
	}
	for math.Ldexp(clip, f-1) >= target {
		f--
	}
	return max(f, 1) // at least one: 0 stands for "derived" in secagg.Params
}

// RoundOnGrid puts x on the grid of 2^fracBits without clipping or noise:
// each coordinate x·2^f is rounded down or up at random, up with
// probability its fractional part, so the rounding is unbiased and the
// low-order bits of x below the grid do not survive. It is the release
// path of an update whose privacy was paid for before (record-level
// DP-SGD): the integers go to secure aggregation as they are, with no
// floating-point step after them. A coordinate that is not finite or
// whose magnitude on the grid reaches 2^62 is refused.
func RoundOnGrid(x []float64, fracBits int, noise *Noise) ([]int64, error) {
	if noise == nil {
		noise = NewNoise()
	}
	rng := noise.fork()
	y := make([]int64, len(x))
	for i, xi := range x {
		v := math.Ldexp(xi, fracBits)
		if !(math.Abs(v) < 1<<62) {
			return nil, diag.New(diag.DPBadGrid, "grid encoding", "value %d is %v, %v on the grid of 2^%d: beyond 2^62", i, xi, v, fracBits).
				WithHelp("the update is not finite or far larger than the round's range; check the strategy and the learning rate")
		}
		fl := math.Floor(v)
		n := int64(fl)
		if rng.Uint64() < uint64((v-fl)*0x1p64) {
			n++
		}
		y[i] = n
	}
	return y, nil
}

// FromGrid decodes integers of the grid of 2^fracBits back to floats (a
// post-processing of a release: it cannot weaken its guarantee).
func FromGrid(y []int64, fracBits int) []float64 {
	return FromGridInto(make([]float64, len(y)), y, fracBits)
}

// FromGridInto is FromGrid into dst (len(dst) == len(y)), which it returns:
// for a caller done with the vector it released, whose buffer can hold
// what was released instead of a second one as long.
func FromGridInto(dst []float64, y []int64, fracBits int) []float64 {
	dst = dst[:len(y)]
	for i, v := range y {
		dst[i] = math.Ldexp(float64(v), -fracBits)
	}
	return dst
}

func (g GridGaussian) bad(format string, args ...any) error {
	return diag.New(diag.DPBadGrid, "grid mechanism", format, args...).
		WithHelp("use dp.GridFracBits(clip, dim) for the grid, a positive finite clip and σ ≥ 0")
}

// norm is the clip bound on the grid, c = Clip·2^FracBits.
func (g GridGaussian) norm() float64 { return math.Ldexp(g.Clip, g.FracBits) }

// Validate checks the parameters.
func (g GridGaussian) Validate() error {
	if !(g.Clip > 0) || math.IsInf(g.Clip, 0) {
		return g.bad("clip %v must be positive and finite", g.Clip)
	}
	if !(g.Sigma >= 0) || math.IsInf(g.Sigma, 0) {
		return g.bad("noise multiplier σ = %v must be non-negative and finite", g.Sigma)
	}
	if g.Dim < 1 {
		return g.bad("dimension %d must be at least 1", g.Dim)
	}
	if c := g.norm(); !(c >= 1) || c > maxGridNorm {
		return g.bad("clip·2^%d = %g on the grid; it must lie in [1, 2^28]", g.FracBits, c)
	}
	if g.Sigma > 0 {
		if t, _ := g.scale(); t > maxGridT {
			return g.bad("noise scale T = %d on the grid exceeds 2^26 (σ = %g is too large for this grid)", t, g.Sigma)
		}
	}
	return nil
}

// Bound returns B, the bound on the squared L2 norm of the encoded vector:
// ⌊c² + d/4 + √(2 ln(1/β))·(c + √d/2)⌋ with c = Clip·2^FracBits and
// β = e^(−1/2) (KLS 2021, Thm 1 with granularity 1 on the grid). The
// rounding is redrawn until the vector meets it, so √B is the sensitivity
// the mechanism is charged with.
func (g GridGaussian) Bound() uint64 {
	c, d := g.norm(), float64(g.Dim)
	return uint64(math.Floor(c*c + d/4 + (c + math.Sqrt(d)/2)))
}

// scale returns T and T² as exact integers: the smallest T with
// T² ≥ σ²·B, σ² taken exactly from the float64 σ.
func (g GridGaussian) scale() (uint64, *big.Int) {
	s2b := new(big.Rat).SetFloat64(g.Sigma)
	s2b.Mul(s2b, s2b)
	s2b.Mul(s2b, new(big.Rat).SetInt(new(big.Int).SetUint64(g.Bound())))
	// ceil(sqrt(σ²B)): isqrt of the ceiling, then one up if short.
	ceil := new(big.Int).Quo(s2b.Num(), s2b.Denom())
	if new(big.Rat).SetInt(ceil).Cmp(s2b) < 0 {
		ceil.Add(ceil, big.NewInt(1))
	}
	t := new(big.Int).Sqrt(ceil)
	if new(big.Int).Mul(t, t).Cmp(ceil) < 0 {
		t.Add(t, big.NewInt(1))
	}
	if !t.IsUint64() {
		return math.MaxUint64, nil
	}
	return t.Uint64(), new(big.Int).Mul(t, t)
}

// NoiseScale returns T, the standard-deviation parameter of the discrete
// Gaussian added to each coordinate (0 when Sigma is 0).
func (g GridGaussian) NoiseScale() uint64 {
	if g.Sigma == 0 {
		return 0
	}
	t, _ := g.scale()
	return t
}

// MaxMagnitude returns the largest absolute value a released coordinate
// takes except with probability below 2·e^(−HeadroomSigmas²/2):
// ⌈√B⌉ + HeadroomSigmas·T. A ring whose per-coordinate bound is below it
// must refuse the run (the sum could wrap around).
func (g GridGaussian) MaxMagnitude() float64 {
	return math.Ceil(math.Sqrt(float64(g.Bound()))) + HeadroomSigmas*float64(g.NoiseScale())
}

// Mechanisms returns what one release costs: one step of the Gaussian
// mechanism with noise multiplier Sigma and q = 1 (nil when Sigma is 0).
func (g GridGaussian) Mechanisms() []Mechanism {
	if g.Sigma == 0 {
		return nil
	}
	return []Mechanism{SubsampledGaussian(g.Sigma, 1, 1)}
}

// Release runs the mechanism on x (clipped in place) and returns the
// released integer vector. noise supplies the randomness (NewNoise() if
// nil): the rounding coins and a ChaCha8 stream keyed from it for the
// discrete Gaussian.
func (g GridGaussian) Release(x []float64, noise *Noise) ([]int64, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if len(x) != g.Dim {
		return nil, g.bad("vector of %d values, the mechanism is for %d", len(x), g.Dim)
	}
	if noise == nil {
		noise = NewNoise()
	}
	ClipL2(x, g.Clip)
	c := g.norm()
	// The rounding scales x onto the grid as it goes: scaling up by 2^f
	// is exact (c ≤ 2^28: nothing overflows), so ‖x·2^f‖ = 2^f·‖x‖ ≤ c.
	v, scale := x, math.Ldexp(1, g.FracBits)
	if g.FracBits < 0 {
		// Scaling down can round in the subnormal range; re-clip on the
		// grid so ‖v‖ ≤ c holds in floating point whatever happened.
		v, scale = make([]float64, len(x)), 1
		for i, xi := range x {
			v[i] = math.Ldexp(xi, g.FracBits)
		}
		ClipL2(v, c)
	}
	// (The sensitivity never rests on this: the rounding below checks
	// the integer vector's norm exactly.)
	y, err := roundConditional(v, scale, g.Bound(), noise.forkChaCha8())
	if err != nil {
		return nil, g.bad("%v", err)
	}
	if g.Sigma > 0 {
		t, _ := g.scale()
		addIntGaussian(y, t, noise)
	}
	return y, nil
}

// parallelFrom is the vector length from which the noise is drawn on
// several goroutines, each on its own stream keyed from the Noise.
const parallelFrom = 1 << 15

// addIntGaussian adds independent N_Z(0, t²) draws to every coordinate of
// y, in parallel chunks for long vectors (the draws are independent, so
// splitting them changes nothing in the distribution).
func addIntGaussian(y []int64, t uint64, noise *Noise) {
	workers := min(runtime.GOMAXPROCS(0), len(y)/parallelFrom+1)
	if workers <= 1 {
		addGridGaussian(y, t, noise.forkChaCha8())
		return
	}
	var wg sync.WaitGroup
	chunk := (len(y) + workers - 1) / workers
	for lo := 0; lo < len(y); lo += chunk {
		part := y[lo:min(lo+chunk, len(y))]
		src := noise.forkChaCha8()
		wg.Go(func() { addGridGaussian(part, t, src) })
	}
	wg.Wait()
}

// ReleaseOnGrid noises sums (or any vector) on the grid and returns the
// released integers with the mechanisms to charge for them: the function a
// silo calls for everything it releases besides its update — for example
// the sums of a federated evaluation. clip bounds the L2 norm of the
// vector's change when the protected unit (a record, or the whole silo) is
// added or removed; the caller clips what it computes per unit so that the
// bound holds (ReleaseOnGrid clips the vector itself to it as well). sigma
// is the noise multiplier; charge the returned mechanisms in the same
// ledger entry as whatever else the round releases, before releasing y.
// Decode y (or its secure sum) by dividing by 2^fracBits.
func ReleaseOnGrid(x []float64, clip, sigma float64, fracBits int, noise *Noise) (y []int64, charge []Mechanism, err error) {
	if !(sigma > 0) {
		return nil, nil, diag.New(diag.DPBadGrid, "grid mechanism", "noise multiplier σ = %v: a release must be noised", sigma).
			WithHelp("give σ > 0 (scellis privacy calibrate --q 1 chooses it for a target ε)")
	}
	g := GridGaussian{Clip: clip, Sigma: sigma, FracBits: fracBits, Dim: len(x)}
	y, err = g.Release(x, noise)
	if err != nil {
		return nil, nil, err
	}
	return y, g.Mechanisms(), nil
}

// roundConditional rounds v·scale (finite, its norm small enough for
// 64-bit squares; scale a power of two under which v·scale is exact) to
// integers, each coordinate up with probability its fractional part,
// redrawing the whole vector until its squared norm is at most bound.
func roundConditional(v []float64, scale float64, bound uint64, rng *rand.ChaCha8) ([]int64, error) {
	y := make([]int64, len(v))
	for range roundingTries {
		var hi, lo uint64
		for i, x := range v {
			x *= scale // a power of two that overflows nothing: exact
			fl := math.Floor(x)
			n := int64(fl)
			// frac·2^64 is exact: frac has at most 53 significant bits.
			if rng.Uint64() < uint64((x-fl)*0x1p64) {
				n++
			}
			y[i] = n
			a := uint64(n)
			if n < 0 {
				a = uint64(-n)
			}
			h, l := bits.Mul64(a, a)
			var carry uint64
			lo, carry = bits.Add64(lo, l, 0)
			hi += h + carry
		}
		if hi == 0 && lo <= bound {
			return y, nil
		}
	}
	return nil, fmt.Errorf("the conditional rounding failed %d times in a row; the vector is not within the clip", roundingTries)
}
