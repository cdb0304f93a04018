package dp

import (
	"math"
	"math/big"
	"testing"
)

// The certified bounds on exp(−q) hold and are tight: against 30 known
// digits of e^−1, against math.Exp, and bounds at two precisions overlap
// (both are certified, so they must).
func TestExpNegBounds(t *testing.T) {
	e1, _ := new(big.Float).SetPrec(200).SetString("0.367879441171442321595523770161")
	lo, hi := expNegBounds(big.NewInt(1), big.NewInt(1), 160)
	flo := new(big.Float).SetPrec(200).SetMantExp(new(big.Float).SetInt(lo), -160)
	fhi := new(big.Float).SetPrec(200).SetMantExp(new(big.Float).SetInt(hi), -160)
	tol := new(big.Float).SetFloat64(1e-29)
	if new(big.Float).Sub(e1, flo).Cmp(tol) > 0 || new(big.Float).Sub(fhi, e1).Cmp(tol) > 0 || flo.Cmp(fhi) > 0 {
		t.Fatalf("e^-1 bounds [%v, %v] miss 0.367879441171442321595523770161", flo, fhi)
	}
	for _, q := range [][2]int64{{0, 1}, {1, 3}, {5, 2}, {32, 1}, {1000, 7}, {1 << 40, 3}, {1<<41 + 3, 1 << 41}, {123456789, 1000}} {
		qn, qd := big.NewInt(q[0]), big.NewInt(q[1])
		lo64, hi64 := expNegBounds(qn, qd, 64)
		lo200, hi200 := expNegBounds(qn, qd, 200)
		for _, p := range []struct {
			lo, hi *big.Int
		}{{lo64, hi64}, {lo200, hi200}} {
			if p.lo.Sign() < 0 || p.lo.Cmp(p.hi) > 0 || new(big.Int).Sub(p.hi, p.lo).Cmp(big.NewInt(8)) > 0 {
				t.Errorf("q=%d/%d: bounds [%v, %v] not ordered or not tight", q[0], q[1], p.lo, p.hi)
			}
		}
		// Overlap at the finer scale.
		l := new(big.Int).Lsh(lo64, 136)
		if lo200.Cmp(l) > 0 {
			l = lo200
		}
		h := new(big.Int).Lsh(hi64, 136)
		if hi200.Cmp(h) < 0 {
			h = hi200
		}
		if l.Cmp(h) > 0 {
			t.Errorf("q=%d/%d: bounds at 64 and 200 bits do not overlap", q[0], q[1])
		}
		want := math.Exp(-float64(q[0]) / float64(q[1]))
		if got := ldexpInt(lo64, -64); math.Abs(got-want) > 1e-15 {
			t.Errorf("q=%d/%d: %v, math.Exp says %v", q[0], q[1], got, want)
		}
	}
}

// gridTestTs are the scales the table tests cover: tiny (w = 1), around
// the switch to wider blocks, the d = 10^6 benchmark's, and the largest.
var gridTestTs = []uint64{1, 2, 3, 15, 16, 17, 33, 1000, 65537, 70001, maxGridT}

// The table's invariants: the alias table draws each outcome with exactly
// its integer weight, every acceptance constant c_b is at most 1 (each
// weight covers its block's envelope), the bounds on c_b are tight, and
// the envelope wastes little.
func TestGridTableInvariants(t *testing.T) {
	for _, T := range gridTestTs {
		for _, core := range []uint64{1, gridCoreSigmas} {
			tab := buildGaussTable(T, core)
			got := make([]uint64, len(tab.alias))
			for j, e := range tab.alias {
				got[j] += uint64(e.thr)
				if e.thr < 1<<gridAliasBits {
					got[e.alias] += 1<<gridAliasBits - uint64(e.thr)
				}
			}
			var sum uint64
			for o, w := range tab.weights {
				sum += w
				if got[o] != w {
					t.Fatalf("T=%d: the alias table draws outcome %d with weight %d, not %d", T, o, got[o], w)
				}
			}
			for o := len(tab.weights); o < len(got); o++ {
				if got[o] != 0 {
					t.Fatalf("T=%d: the alias table draws unused outcome %d", T, o)
				}
			}
			if sum != 1<<(tab.idxBits+gridAliasBits) {
				t.Fatalf("T=%d: weights sum to %d", T, sum)
			}
			if tab.ymax < core*T || tab.ymax < T {
				t.Fatalf("T=%d: the core ends at %d", T, tab.ymax)
			}
			// The tail's first block, where its acceptance is largest,
			// accepts with probability at most 1.
			qn := new(big.Int).SetUint64(tab.ymax)
			qn.Mul(qn, qn)
			rn := new(big.Int).Mul(tab.k.Num(), new(big.Int).SetUint64(2*tab.ymax))
			rd := new(big.Int).Mul(tab.k.Denom(), new(big.Int).SetUint64(tab.weights[tab.n]))
			if lo, _ := aBounds(qn, tab.twoT2, rn, rd, 64); lo.Cmp(new(big.Int).Lsh(big.NewInt(1), 64)) > 0 {
				t.Fatalf("T=%d: the tail accepts with probability above 1", T)
			}
			for b := range tab.n {
				if !(0 < tab.cLo[b] && tab.cLo[b] <= tab.cHi[b] && tab.cHi[b] <= 1 && tab.cHi[b]-tab.cLo[b] < 1e-12) {
					t.Fatalf("T=%d block %d: c bounds [%v, %v]", T, b, tab.cLo[b], tab.cHi[b])
				}
			}
			// Expected acceptance of a proposal: the target's mass
			// over the envelope's.
			// Σ_{y≥0} e(y) = (Σ_{y∈Z} e(y) + 1)/2, and the full sum is
			// √(2π)·T to within a relative e^(−2π²) (Poisson summation).
			mass := (math.Sqrt(2*math.Pi)*float64(T) + 1) / 2
			k, _ := tab.k.Float64()
			acc := k * mass / float64(sum)
			if core == gridCoreSigmas && acc < 0.94 {
				t.Errorf("T=%d: a proposal is accepted with probability %.3f only", T, acc)
			}
		}
	}
}

// The float squeeze never contradicts the exact comparison: for blocks
// and offsets across each table, and for U prefixes of 16 and 48 bits at
// random and on either side of A, whenever the squeeze decides, A
// bracketed at 160 bits agrees, and a prefix whose interval contains A is
// never decided.
func TestGridSqueezeMatchesExact(t *testing.T) {
	src := newNoiseFromSeed([32]byte{80})
	decided, total := 0, 0
	for _, T := range []uint64{1, 3, 17, 1000, 70001, maxGridT} {
		tab := buildGaussTable(T, gridCoreSigmas)
		w := tab.blockWidth()
		for _, b := range []int{0, 1, 2, tab.n / 3, tab.n / 2, tab.n - 1} {
			for _, i := range []uint64{0, 1, w / 3, w / 2, w - 1, src.uint64n(w)} {
				i %= w
				y := uint64(b)*w + i
				qn := new(big.Int).SetUint64(y)
				qn.Mul(qn, qn)
				rn := new(big.Int).Mul(tab.k.Num(), new(big.Int).SetUint64(w))
				rd := new(big.Int).Mul(tab.k.Denom(), new(big.Int).SetUint64(tab.weights[b]))
				const prec = 160
				lo, hi := aBounds(qn, tab.twoT2, rn, rd, prec)
				a := ldexpInt(lo, -prec)
				z := tab.z(b, i)
				for _, plen := range []int{16, 48} {
					xs := []uint64{src.Uint64() >> (64 - plen), src.Uint64() >> (64 - plen)}
					if c := uint64(math.Ldexp(a, plen)); c > 0 {
						xs = append(xs, c-1, c, c+1, c+2)
					} else {
						xs = append(xs, 0, 1)
					}
					for _, x := range xs {
						if x >= 1<<plen {
							continue
						}
						sure := new(big.Int).Lsh(new(big.Int).SetUint64(x+1), prec-uint(plen)).Cmp(lo) <= 0
						never := new(big.Int).Lsh(new(big.Int).SetUint64(x), prec-uint(plen)).Cmp(hi) >= 0
						accept, ok := tab.squeeze(b, z, x, plen, plen == 48)
						total++
						if !ok {
							continue
						}
						decided++
						if accept && !sure || !accept && !never {
							t.Fatalf("T=%d y=%d x=%d/2^%d: the squeeze says accept=%v, A ∈ [%v, %v]", T, y, x, plen, accept, ldexpInt(lo, -prec), ldexpInt(hi, -prec))
						}
					}
				}
			}
		}
	}
	if decided < total/2 {
		t.Errorf("the squeeze decided only %d of %d prefixes", decided, total)
	}
}

// The exact continuation accepts with the right probability: from a fresh
// U it accepts with probability A, and from the 16-bit prefix whose
// interval straddles A with probability frac(A·2^16) (z-scores on fixed
// seeds, |z| ≤ 6).
func TestGridAcceptSlow(t *testing.T) {
	tab := buildGaussTable(1000, gridCoreSigmas)
	g := newGridSampler(tab, newNoiseFromSeed([32]byte{81}).forkChaCha8())
	w := tab.blockWidth()
	b, i := 40, w/3
	y := uint64(b)*w + i
	k, _ := tab.k.Float64()
	a := k * math.Exp(-float64(y*y)/(2e6)) * float64(w) / float64(tab.weights[b])
	x := uint64(math.Ldexp(a, 16))
	const n = 3000
	for _, c := range []struct {
		x    uint64
		plen uint
		p    float64
	}{{0, 0, a}, {x, 16, math.Ldexp(a, 16) - float64(x)}} {
		hits := 0
		for range n {
			if g.acceptSlow(c.x, c.plen, y, tab.k, w, tab.weights[b], 0) {
				hits++
			}
		}
		if z := (float64(hits) - n*c.p) / math.Sqrt(n*c.p*(1-c.p)); math.Abs(z) > 6 {
			t.Errorf("prefix %d/2^%d: accepted %d of %d, expected p = %.4f (z %.1f)", c.x, c.plen, hits, n, c.p, z)
		}
	}
}

// The table sampler is N_Z(0, T²): χ² against the exact pmf and the
// variance against the exact variance, with fixed seeds and |z| ≤ 6, for
// tiny to largest T; the same χ² rejects a scale 5% off (so the test has
// the power to fail). Tables whose core ends at T send about a third of
// the draws through the tail and the exact comparison.
func TestGridSamplerIsDiscreteGaussian(t *testing.T) {
	for i, c := range []struct {
		T, core uint64
		n       int
	}{{1, 8, 60000}, {3, 8, 60000}, {25, 8, 60000}, {1000, 8, 60000}, {70001, 8, 60000}, {maxGridT, 8, 60000}, {1, 1, 4000}, {300, 1, 4000}} {
		tab := buildGaussTable(c.T, c.core)
		g := newGridSampler(tab, newNoiseFromSeed([32]byte{byte(100 + i)}).forkChaCha8())
		counts := map[int64]int{}
		var sum2 float64
		tail := 0
		for range c.n {
			y := g.sample()
			counts[y]++
			sum2 += float64(y) * float64(y)
			if uint64(max(y, -y)) >= tab.ymax {
				tail++
			}
		}
		T := float64(c.T)
		w := max(int64(c.T)/8, 1)
		if z := chi2Z(counts, c.n, T*T, w); z > 6 {
			t.Errorf("T=%d core %d: χ² z-score %.1f against N_Z(0, T²)", c.T, c.core, z)
		}
		// The variance of N_Z(0, T²) and of Y² (for the z-score): exact
		// sums, or T² and 2T⁴ for large T (the discrete Gaussian's
		// moments differ from the continuous ones by e^(−2π²T²)).
		m2, m4 := T*T, 3*T*T*T*T
		if c.T <= 1000 {
			var zs float64
			m2, m4 = 0, 0
			for y := -int64(40*T) - 10; y <= int64(40*T)+10; y++ {
				p := math.Exp(-float64(y*y) / (2 * T * T))
				zs += p
				m2 += p * float64(y*y)
				m4 += p * float64(y*y) * float64(y*y)
			}
			m2, m4 = m2/zs, m4/zs
		}
		if z := (sum2/float64(c.n) - m2) / math.Sqrt((m4-m2*m2)/float64(c.n)); math.Abs(z) > 6 {
			t.Errorf("T=%d core %d: variance %.4g, exact %.4g (z %.1f)", c.T, c.core, sum2/float64(c.n), m2, z)
		}
		if c.core == 1 && tail < c.n/5 {
			t.Errorf("T=%d: only %d of %d draws from the tail", c.T, tail, c.n)
		}
		if c.T >= 25 && c.n >= 60000 {
			for _, f := range []float64{0.95, 1.05} {
				if z := chi2Z(counts, c.n, f*f*T*T, w); z < 6 {
					t.Errorf("T=%d: the test does not tell N_Z(0, (%.2fT)²) apart (z %.1f)", c.T, f, z)
				}
			}
		}
	}
}

// BenchmarkGridSampler compares, in one run, the table sampler with the
// reference sampler (CKS 2020, intGaussian) at the d = 10^6 benchmark's
// scale, T = 65537, one goroutine each: reported as ref/table.
func BenchmarkGridSampler(b *testing.B) {
	const T, batch = 65537, 200000
	tab := newGridSampler(gaussTableFor(T), newNoiseFromSeed([32]byte{1}).forkChaCha8())
	ref := newIntGaussian(T, newNoiseFromSeed([32]byte{2}).forkChaCha8())
	v := make([]int64, batch)
	var tt, tr float64
	for b.Loop() {
		t0 := nowNanos()
		tab.addTo(v)
		t1 := nowNanos()
		ref.addTo(v)
		t2 := nowNanos()
		tt += float64(t1 - t0)
		tr += float64(t2 - t1)
	}
	b.ReportMetric(tt/float64(b.N)/batch, "table-ns/sample")
	b.ReportMetric(tr/float64(b.N)/batch, "ref-ns/sample")
	b.ReportMetric(tr/tt, "ref/table")
}
