package verify_test

import (
	"crypto/rand"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/scellis/scellis/tensor"
	"github.com/scellis/scellis/verify"
	"github.com/scellis/scellis/verify/freivalds"
)

// randMatrix fills an r×c matrix from a seeded generator (test data only;
// the check's own randomness comes from crypto/rand).
func randMatrix(g *mrand.Rand, r, c int) *tensor.Matrix {
	m, _ := tensor.NewMatrix(r, c, nil)
	for i := range m.Data {
		m.Data[i] = g.NormFloat64()
	}
	return m
}

func product(t testing.TB, a, b *tensor.Matrix) *tensor.Matrix {
	c, err := tensor.MatMul(a, b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// seeded is a reproducible bit source for statistical tests of the bound.
type seeded struct{ g *mrand.ChaCha8 }

func (s seeded) Read(p []byte) (int, error) { return s.g.Read(p) }

func TestFreivaldsCatchesOneWrongEntryWithK20(t *testing.T) {
	g := mrand.New(mrand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 64} {
		a, b := randMatrix(g, n, n), randMatrix(g, n, n)
		c := product(t, a, b)
		res, err := freivalds.Check(a, b, c, 20, rand.Reader)
		if err != nil || !res.OK {
			t.Fatalf("n=%d: the honest product fails: %+v %v", n, res, err)
		}
		for _, delta := range []float64{1, 1e-6} {
			bad := c.Clone()
			i, j := g.IntN(n), g.IntN(n)
			bad.Set(i, j, bad.At(i, j)+delta)
			res, err = freivalds.Check(a, b, bad, 20, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			// Missed with probability 2^-20 per run.
			if res.OK {
				t.Fatalf("n=%d: C[%d][%d] off by %g passed 20 rounds", n, i, j, delta)
			}
			if res.Row != i {
				t.Fatalf("n=%d: flagged row %d, the wrong entry is in row %d", n, res.Row, i)
			}
		}
	}
}

// A single round misses a single wrong entry exactly when r's bit for its
// column is 0: half the time. The measured miss rate of 4000 one-round
// checks must be near 1/2, and of 2-round checks near 1/4 (2^-k).
func TestFreivaldsMissRateMatchesTheory(t *testing.T) {
	g := mrand.New(mrand.NewPCG(3, 4))
	a, b := randMatrix(g, 16, 16), randMatrix(g, 16, 16)
	bad := product(t, a, b)
	bad.Set(5, 9, bad.At(5, 9)+0.5)
	src := seeded{mrand.NewChaCha8([32]byte{7})}
	for k, want := range map[int]float64{1: 0.5, 2: 0.25} {
		const trials = 4000
		missed := 0
		for range trials {
			res, err := freivalds.Check(a, b, bad, k, src)
			if err != nil {
				t.Fatal(err)
			}
			if res.OK {
				missed++
			}
		}
		// ±5 standard deviations of a binomial(4000, want).
		if got := float64(missed) / trials; got < want-0.04 || got > want+0.04 {
			t.Fatalf("k=%d: missed %.3f of wrong products, theory 2^-k = %.3f", k, got, want)
		}
	}
}

// Check against the dumb reference: every honest product of random shapes
// passes, and so does the same product summed in another order (a float
// product from another kernel is not bit-identical but must pass).
func TestFreivaldsAgainstFullRecomputation(t *testing.T) {
	g := mrand.New(mrand.NewPCG(5, 6))
	for range 200 {
		m, n, p := 1+g.IntN(12), 1+g.IntN(12), 1+g.IntN(12)
		a, b := randMatrix(g, m, n), randMatrix(g, n, p)
		c := product(t, a, b)
		// The same product accumulated backwards.
		rev, _ := tensor.NewMatrix(m, p, nil)
		for i := range m {
			for j := range p {
				s := 0.0
				for l := n - 1; l >= 0; l-- {
					s += a.At(i, l) * b.At(l, j)
				}
				rev.Set(i, j, s)
			}
		}
		for _, cc := range []*tensor.Matrix{c, rev} {
			if res, err := freivalds.Check(a, b, cc, 8, rand.Reader); err != nil || !res.OK {
				t.Fatalf("%d×%d·%d×%d honest product refused: %+v %v", m, n, n, p, res, err)
			}
		}
	}
}

func TestFreivaldsRefusesBadInput(t *testing.T) {
	g := mrand.New(mrand.NewPCG(7, 8))
	a, b := randMatrix(g, 3, 4), randMatrix(g, 4, 5)
	c := product(t, a, b)
	if _, err := freivalds.Check(a, b, c, 20, nil); err != freivalds.ErrNoRandomness {
		t.Fatalf("no randomness: %v", err)
	}
	for _, k := range []int{0, verify.MaxFreivaldsRounds + 1} {
		if _, err := freivalds.Check(a, b, c, k, rand.Reader); err == nil {
			t.Fatalf("k=%d accepted", k)
		}
	}
	if _, err := freivalds.Check(a, b, randMatrix(g, 3, 4), 20, rand.Reader); err == nil {
		t.Fatal("a result of the wrong shape is not an error")
	}
	nan := c.Clone()
	nan.Set(1, 1, math.NaN())
	if res, err := freivalds.Check(a, b, nan, 64, rand.Reader); err != nil || res.OK {
		// A NaN entry fails whenever its column is drawn: 2^-64 to miss.
		t.Fatalf("a NaN in C passed: %+v %v", res, err)
	}
}

// BenchmarkFreivalds verifies an n×n product with k = 20 and recomputes it
// in the same run, reporting recompute/verify as a ratio:
//
//	go test ./verify -run XXX -bench Freivalds
//
// Under -short (CI runs every benchmark once that way) only n=256 runs.
func BenchmarkFreivalds(b *testing.B) {
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			if testing.Short() && n > 256 {
				b.Skipf("-short: n=%d skipped (n=256 runs the same check)", n)
			}
			g := mrand.New(mrand.NewPCG(uint64(n), 9))
			x, y := randMatrix(g, n, n), randMatrix(g, n, n)
			c := product(b, x, y)
			var verify, recompute time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				res, err := freivalds.Check(x, y, c, 20, rand.Reader)
				t1 := time.Now()
				if err != nil || !res.OK {
					b.Fatalf("%+v %v", res, err)
				}
				product(b, x, y)
				verify += t1.Sub(t0)
				recompute += time.Since(t1)
			}
			b.ReportMetric(float64(verify.Nanoseconds())/float64(b.N), "verify-ns/op")
			b.ReportMetric(float64(recompute.Nanoseconds())/float64(b.N), "recompute-ns/op")
			b.ReportMetric(float64(recompute)/float64(verify), "recompute/verify")
		})
	}
}
