package dp

import (
	"math"
	"math/big"
	"testing"
)

// exactPMF returns P[X = x] for x in [-k, k] of N_Z(0, σ²), normalised over
// a range wide enough that the rest is below 1e-300.
func exactPMF(sigma2 float64, k int) map[int]float64 {
	w := int(40*math.Sqrt(sigma2)) + k + 10
	var z float64
	for x := -w; x <= w; x++ {
		z += math.Exp(-float64(x*x) / (2 * sigma2))
	}
	p := map[int]float64{}
	for x := -k; x <= k; x++ {
		p[x] = math.Exp(-float64(x*x)/(2*sigma2)) / z
	}
	return p
}

// The sampler's variance, tails and histogram match the exact discrete
// Gaussian. The seed is fixed, so the test is deterministic.
func TestDiscreteGaussianStatistics(t *testing.T) {
	for i, sigma := range []float64{0.7, 3, 25} {
		g, err := NewDiscreteGaussian(sigma, newNoiseFromSeed([32]byte{byte(10 + i)}))
		if err != nil {
			t.Fatal(err)
		}
		s2, _ := g.Sigma2().Float64()
		const N = 60000
		k := int(6*sigma) + 2
		p := exactPMF(s2, k)
		var wantVar, wantM4 float64
		for x, px := range p {
			fx := float64(x)
			wantVar += fx * fx * px
			wantM4 += fx * fx * fx * fx * px
		}
		counts := map[int]int{}
		var sum2 float64
		xs := make([]int64, N)
		g.AddTo(xs)
		for _, x := range xs {
			counts[int(x)]++
			sum2 += float64(x * x)
		}
		gotVar := sum2 / N
		se := math.Sqrt((wantM4 - wantVar*wantVar) / N)
		if math.Abs(gotVar-wantVar) > 5*se {
			t.Errorf("σ=%v: variance %v, exact %v (SE %v)", sigma, gotVar, wantVar, se)
		}
		// Tails: P[|X| ≥ m] for m = 1σ, 2σ, 3σ.
		for _, m := range []float64{1, 2, 3} {
			cut := int(math.Ceil(m * sigma))
			var want float64
			for x, px := range p {
				if x >= cut || -x >= cut {
					want += px
				}
			}
			got := 0
			for x, c := range counts {
				if x >= cut || -x >= cut {
					got += c
				}
			}
			if sd := math.Sqrt(N * want * (1 - want)); math.Abs(float64(got)-N*want) > 5*sd+1 {
				t.Errorf("σ=%v: P[|X|≥%d] observed %d/%d, expected %.1f", sigma, cut, got, N, N*want)
			}
		}
		// χ² over the bins with expected count ≥ 10.
		var chi2 float64
		df := -1
		for x, px := range p {
			if e := N * px; e >= 10 {
				d := float64(counts[x]) - e
				chi2 += d * d / e
				df++
			}
		}
		// Wilson–Hilferty: reject beyond z = 5.
		z := (math.Cbrt(chi2/float64(df)) - (1 - 2/(9*float64(df)))) / math.Sqrt(2/(9*float64(df)))
		if z > 5 {
			t.Errorf("σ=%v: χ²=%.1f with %d degrees of freedom (z=%.1f)", sigma, chi2, df, z)
		}
	}
}

func TestDiscreteGaussianSigma2RoundsUp(t *testing.T) {
	for _, s := range []float64{0.1, 1, math.Pi, 1234.5678} {
		g, err := NewDiscreteGaussian(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		exact := new(big.Rat).SetFloat64(s)
		exact.Mul(exact, exact)
		diff := new(big.Rat).Sub(g.Sigma2(), exact)
		if diff.Sign() < 0 || diff.Cmp(big.NewRat(1, 1<<32)) >= 0 {
			t.Errorf("σ=%v: σ² %s is not the exact value rounded up to 2^-32", s, g.Sigma2().FloatString(20))
		}
	}
	if _, err := NewDiscreteGaussian(0, nil); err == nil {
		t.Error("σ=0 accepted")
	}
}

func TestBernoulliExp(t *testing.T) {
	g, _ := NewDiscreteGaussianRat(big.NewRat(1, 1), newNoiseFromSeed([32]byte{20}))
	for _, gamma := range []*big.Rat{big.NewRat(1, 2), big.NewRat(23, 10), big.NewRat(0, 1)} {
		const N = 50000
		hits := 0
		for range N {
			if g.bernoulliExp(gamma.Num(), gamma.Denom()) {
				hits++
			}
		}
		f, _ := gamma.Float64()
		p := math.Exp(-f)
		if sd := math.Sqrt(N * p * (1 - p)); math.Abs(float64(hits)-N*p) > 5*sd+1e-9 {
			t.Errorf("γ=%v: %d hits of %d, expected %.0f", gamma, hits, N, N*p)
		}
	}
}

func BenchmarkDiscreteGaussian(b *testing.B) {
	g, _ := NewDiscreteGaussian(10, nil)
	for b.Loop() {
		g.Sample()
	}
}
