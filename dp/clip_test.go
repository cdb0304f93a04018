package dp

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestClipL2(t *testing.T) {
	v := []float64{3, 4}
	if n := ClipL2(v, 1); n != 5 {
		t.Fatalf("norm before clipping %v, want 5", n)
	}
	if L2Norm(v) > 1 || math.Abs(v[0]-0.6) > 1e-15 || math.Abs(v[1]-0.8) > 1e-15 {
		t.Fatalf("clipped to %v", v)
	}
	w := []float64{0.3, 0.4}
	if n := ClipL2(w, 1); n != 0.5 || w[0] != 0.3 || w[1] != 0.4 {
		t.Fatalf("a vector inside the ball changed: %v (norm %v)", w, n)
	}
	if n := ClipL2(nil, 1); n != 0 {
		t.Fatalf("empty norm %v", n)
	}
}

// After clipping, the norm is at most c exactly, at every scale, so the
// sensitivity the accountant assumes holds bit for bit.
func TestClipL2BoundIsExact(t *testing.T) {
	r := rand.New(rand.NewChaCha8([32]byte{3}))
	for i := 0; i < 2000; i++ {
		v := make([]float64, 1+r.IntN(300))
		scale := math.Pow(10, float64(r.IntN(600)-300))
		for j := range v {
			v[j] = r.NormFloat64() * scale
		}
		c := math.Pow(10, float64(r.IntN(40)-20)) * r.Float64()
		if c == 0 {
			continue
		}
		ClipL2(v, c)
		if n := L2Norm(v); n > c {
			t.Fatalf("norm %v after clipping to %v", n, c)
		}
	}
}

func TestClipL2NonFinite(t *testing.T) {
	v := []float64{1, math.NaN()}
	if n := ClipL2(v, 1); !math.IsNaN(n) || v[0] != 0 || v[1] != 0 {
		t.Fatalf("NaN vector: norm %v, v %v", n, v)
	}
	w := []float64{math.Inf(-1), 1}
	if n := ClipL2(w, 1); !math.IsInf(n, 1) || w[0] != 0 {
		t.Fatalf("Inf vector: norm %v, v %v", n, w)
	}
	if n := L2Norm([]float64{1e300, 1e300}); relErr(n, math.Sqrt2*1e300) > 1e-15 {
		t.Fatalf("overflowing norm %v", n)
	}
}

func TestClipL2RejectsBadBound(t *testing.T) {
	for _, c := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("ClipL2 accepted bound %v", c)
				}
			}()
			ClipL2([]float64{1}, c)
		}()
	}
}

func TestClipPerExample(t *testing.T) {
	g := [][]float64{{3, 4}, {0.1, 0}, {0, 2}}
	if n := ClipPerExample(g, 1); n != 2 {
		t.Fatalf("clipped %d rows, want 2", n)
	}
	for _, row := range g {
		if L2Norm(row) > 1 {
			t.Fatalf("row %v not clipped", row)
		}
	}
}
