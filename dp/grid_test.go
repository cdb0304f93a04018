package dp

import (
	"math"
	"testing"
	"time"
)

// chi2Z returns the Wilson–Hilferty z-score of a χ² test of counts against
// N_Z(0, s²) (exact pmf), over bins of width w around 0 with expected
// counts ≥ 10, the tails pooled.
// Beyond s = 5000 it bins the continuous approximation (chi2ZWide)
// instead of summing the pmf point by point.
func chi2Z(counts map[int64]int, n int, s2 float64, w int64) float64 {
	if s2 > 5000*5000 {
		return chi2ZWide(counts, n, s2, w)
	}
	span := int64(40*math.Sqrt(s2)) + 10
	var z float64
	for x := -span; x <= span; x++ {
		z += math.Exp(-float64(x*x) / (2 * s2))
	}
	bin := func(x int64) int64 {
		if x >= 0 {
			return x / w
		}
		return -((-x + w - 1) / w)
	}
	exp, obs := map[int64]float64{}, map[int64]float64{}
	for x := -span; x <= span; x++ {
		exp[bin(x)] += float64(n) * math.Exp(-float64(x*x)/(2*s2)) / z
	}
	for x, c := range counts {
		obs[bin(x)] += float64(c)
	}
	// Pool bins with expected count < 10 into the two tails.
	var chi2 float64
	df := -1
	var tailE, tailO float64
	for b, e := range exp {
		if e < 10 {
			tailE += e
			tailO += obs[b]
			delete(obs, b)
			continue
		}
		d := obs[b] - e
		chi2 += d * d / e
		delete(obs, b)
		df++
	}
	for _, o := range obs { // observations outside the span
		tailO += o
	}
	return chi2Pooled(chi2, df, tailE, tailO)
}

// chi2Pooled adds the pooled tail bin (expected tailE, observed tailO) to
// a χ² with df degrees of freedom so far and returns its Wilson–Hilferty
// z-score.
func chi2Pooled(chi2 float64, df int, tailE, tailO float64) float64 {
	if tailE > 0 {
		d := tailO - tailE
		chi2 += d * d / tailE
		df++
	}
	k := float64(df)
	return (math.Cbrt(chi2/k) - (1 - 2/(9*k))) / math.Sqrt(2/(9*k))
}

// chi2ZWide is chi2Z for scales too large to sum the pmf point by point:
// a bin [a, b) of integers has probability Φ((b−½)/s) − Φ((a−½)/s) up to
// a relative O(1/s²) (Euler–Maclaurin), far below what 10^5 draws resolve.
func chi2ZWide(counts map[int64]int, n int, s2 float64, w int64) float64 {
	s := math.Sqrt(s2)
	cdf := func(x float64) float64 { return 0.5 * math.Erfc(-x/(s*math.Sqrt2)) }
	bin := func(x int64) int64 {
		if x >= 0 {
			return x / w
		}
		return -((-x + w - 1) / w)
	}
	lim := int64(12*s)/w + 1
	obs := map[int64]float64{}
	for x, c := range counts {
		obs[max(-lim, min(lim, bin(x)))] += float64(c)
	}
	var chi2, tailE, tailO float64
	df := -1
	for b := -lim; b <= lim; b++ {
		lo, hi := float64(b*w)-0.5, float64((b+1)*w)-0.5
		p := cdf(hi) - cdf(lo)
		if b == -lim {
			p = cdf(hi)
		} else if b == lim {
			p = 1 - cdf(lo)
		}
		e := float64(n) * p
		if e < 10 { // pooled into one tail bin
			tailE += e
			tailO += obs[b]
			continue
		}
		d := obs[b] - e
		chi2 += d * d / e
		df++
	}
	return chi2Pooled(chi2, df, tailE, tailO)
}

// The 64-bit sampler is N_Z(0, T²) exactly: χ² against the exact pmf for
// small and large T, with fixed seeds (deterministic), and the same test
// rejects a scale 5% off, so it cannot pass by accident.
func TestIntGaussianIsDiscreteGaussian(t *testing.T) {
	for i, T := range []uint64{1, 25, 1000, 70000} {
		g := newIntGaussian(T, newNoiseFromSeed([32]byte{byte(40 + i)}).forkChaCha8())
		const n = 40000
		counts := map[int64]int{}
		for range n {
			counts[g.sample()]++
		}
		w := max(int64(T)/8, 1)
		if z := chi2Z(counts, n, float64(T*T), w); z > 5 {
			t.Errorf("T=%d: χ² z-score %.1f against N_Z(0, T²)", T, z)
		}
		if T >= 25 {
			for _, f := range []float64{0.95, 1.05} {
				s := f * float64(T)
				if z := chi2Z(counts, n, s*s, w); z < 5 {
					t.Errorf("T=%d: the test does not tell N_Z(0, (%.2fT)²) apart (z %.1f)", T, f, z)
				}
			}
		}
	}
}

// The conditional rounding never exceeds the sensitivity bound, and the
// noise scale T satisfies T² ≥ σ²·B, so the release is charged as the
// Gaussian with multiplier σ.
func TestGridGaussianSensitivityAndScale(t *testing.T) {
	src := newNoiseFromSeed([32]byte{50})
	for _, d := range []int{1, 10, 1000, 100000} {
		g := GridGaussian{Clip: 1, FracBits: GridFracBits(1, d), Dim: d}
		B := g.Bound()
		for rep := range 20 {
			x := make([]float64, d)
			for i := range x {
				x[i] = src.Float64() - 0.5 + float64(rep%3)
			}
			y, err := g.Release(x, src) // σ = 0: rounding only
			if err != nil {
				t.Fatal(err)
			}
			var s2 uint64
			for _, v := range y {
				s2 += uint64(v * v)
			}
			if s2 > B {
				t.Fatalf("d=%d: encoded squared norm %d exceeds the bound %d", d, s2, B)
			}
		}
		c := math.Ldexp(1, g.FracBits)
		if infl := math.Sqrt(float64(B)) / c; infl > 1+1.0/512 {
			t.Errorf("d=%d: rounding inflates the sensitivity by %v", d, infl)
		}
		for _, sigma := range []float64{0.3, 1, 1.1, 7} {
			g.Sigma = sigma
			T := float64(g.NoiseScale())
			if T*T < sigma*sigma*float64(B) || (T-1)*(T-1) >= sigma*sigma*float64(B) {
				t.Errorf("d=%d σ=%v: T=%v is not the least integer with T² ≥ σ²B (B=%d)", d, sigma, T, B)
			}
			if ms := g.Mechanisms(); len(ms) != 1 || ms[0] != SubsampledGaussian(sigma, 1, 1) {
				t.Errorf("charge %v", ms)
			}
		}
	}
	if _, _, err := ReleaseOnGrid([]float64{1}, 1, 0, 10, nil); err == nil {
		t.Error("a release without noise was accepted")
	}
	if err := (GridGaussian{Clip: 1, Sigma: 1e6, FracBits: 20, Dim: 4}).Validate(); err == nil {
		t.Error("a noise scale beyond 2^26 was accepted")
	}
}

// BenchmarkGridRelease compares, in one run, the release of a d = 10^6
// update on the grid (clip, conditional rounding, exact discrete Gaussian)
// with the float path it replaced (clip, float Gaussian noise, stochastic
// rounding onto the ring): the ratio is reported as grid/float.
func BenchmarkGridRelease(b *testing.B) {
	const d = 1_000_000
	src := NewNoise()
	x := make([]float64, d)
	for i := range x {
		x[i] = src.Float64() - 0.5
	}
	g := GridGaussian{Clip: 1, Sigma: 1, FracBits: GridFracBits(1, d), Dim: d}
	floatPath := func() {
		v := append([]float64(nil), x...)
		ClipL2(v, 1)
		src.AddGaussian(v, 1)
		rng := src.fork()
		y := make([]int64, d)
		scale := math.Ldexp(1, 40) // the ring's fixed point for clip 1e6
		for i, xi := range v {
			s := xi * scale
			fl := math.Floor(s)
			n := int64(fl)
			if rng.Uint64() < uint64((s-fl)*0x1p64) {
				n++
			}
			y[i] = n
		}
	}
	gridPath := func() {
		if _, err := g.Release(append([]float64(nil), x...), src); err != nil {
			b.Fatal(err)
		}
	}
	var tf, tg float64
	for b.Loop() {
		t0 := nowNanos()
		floatPath()
		t1 := nowNanos()
		gridPath()
		t2 := nowNanos()
		tf += float64(t1 - t0)
		tg += float64(t2 - t1)
	}
	b.ReportMetric(tf/float64(b.N)/1e6, "float-ms/op")
	b.ReportMetric(tg/float64(b.N)/1e6, "grid-ms/op")
	b.ReportMetric(tg/tf, "grid/float")
}

func nowNanos() int64 { return time.Now().UnixNano() }

// A zero vector rounds to zeros exactly, so what Release returns is the
// noise alone: on a vector long enough to be noised on several goroutines
// (each on its own stream), it is N_Z(0, T²) by χ², and not a 5% wider
// or narrower scale.
func TestGridGaussianReleaseNoiseIsExact(t *testing.T) {
	d := 2 * parallelFrom
	g := GridGaussian{Clip: 1, Sigma: 0.8, FracBits: GridFracBits(1, d), Dim: d}
	y, err := g.Release(make([]float64, d), newNoiseFromSeed([32]byte{60}))
	if err != nil {
		t.Fatal(err)
	}
	T := float64(g.NoiseScale())
	counts := map[int64]int{}
	for _, v := range y {
		counts[v]++
	}
	w := int64(T / 8)
	if z := chi2Z(counts, d, T*T, w); z > 5 {
		t.Fatalf("Release noise is not N_Z(0, T²), T = %v: χ² z %.1f", T, z)
	}
	for _, f := range []float64{0.95, 1.05} {
		if z := chi2Z(counts, d, f*f*T*T, w); z < 5 {
			t.Fatalf("the test cannot tell a scale of %.2f·T apart (z %.1f)", f, z)
		}
	}
}

// The sampler's building blocks against their exact probabilities: the
// lazy Bernoulli(n/d) on each chunk size (16, 32 and 64 bits) and
// Bernoulli(exp(−1)) by inversion, by z-scores on fixed seeds, and the
// inversion's fast path agrees with its exact big-integer continuation on
// every prefix it decides.
func TestIntGaussianBernoullis(t *testing.T) {
	g := newIntGaussian(1, newNoiseFromSeed([32]byte{70}).forkChaCha8())
	const n = 200000
	z := func(hits int, p float64) float64 {
		return (float64(hits) - n*p) / math.Sqrt(n*p*(1-p))
	}
	for _, c := range [][2]uint64{{1, 3}, {2, 7}, {100, 255}, {12345, 1 << 20}, {3, 1<<24 - 1}, {1 << 32, 3 << 32}, {5 << 40, 1<<63 - 25}} {
		hits := 0
		for range n {
			if g.bernoulliRat(c[0], c[1]) {
				hits++
			}
		}
		p := float64(c[0]) / float64(c[1])
		if zz := z(hits, p); math.Abs(zz) > 5 {
			t.Errorf("Bernoulli(%d/%d): %d of %d, z %.1f", c[0], c[1], hits, n, zz)
		}
	}
	hits := 0
	for range n {
		if g.bernoulliExpOne() {
			hits++
		}
	}
	if zz := z(hits, math.Exp(-1)); math.Abs(zz) > 5 {
		t.Errorf("Bernoulli(exp(−1)): %d of %d, z %.1f", hits, n, zz)
	}
	src := newNoiseFromSeed([32]byte{71})
	for range 10000 {
		x := src.Uint64()
		if g.expOneFrom(x) != g.expOneSlow(x, 1) {
			t.Fatalf("prefix %#x: the fast inversion and the exact continuation disagree", x)
		}
	}
	// Prefixes on the thresholds themselves go on to more bits: given the
	// same further bits, the two paths decide alike.
	for k := 1; k <= 20; k++ {
		x := uint64(math.MaxUint64) / factorials[k]
		for s := range byte(8) {
			g1 := newIntGaussian(1, newNoiseFromSeed([32]byte{72, s}).forkChaCha8())
			g2 := newIntGaussian(1, newNoiseFromSeed([32]byte{72, s}).forkChaCha8())
			if g1.expOneFrom(x) != g2.expOneSlow(x, 1) {
				t.Fatalf("threshold prefix for %d!: fast and exact paths disagree", k)
			}
		}
	}
}
