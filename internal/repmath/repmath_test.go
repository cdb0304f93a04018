package repmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ulps is the distance between a and b in units in the last place.
func ulps(a, b float64) uint64 {
	ia, ib := int64(math.Float64bits(a)), int64(math.Float64bits(b))
	if ia < 0 {
		ia = math.MinInt64 - ia
	}
	if ib < 0 {
		ib = math.MinInt64 - ib
	}
	if ia > ib {
		return uint64(ia - ib)
	}
	return uint64(ib - ia)
}

// TestCloseToMath checks each function against the standard
// library's on random arguments over its working range: the explicit
// rounding must not cost accuracy (both are the same algorithm; they may
// differ where the standard one is assembly or fused: amd64's assembly Exp
// is within an ulp on the other side, and Tanh's 1 − 2/(e^2x + 1) carries
// Exp's ulp through a cancellation, so those two may be two ulps apart).
func TestCloseToMath(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		name   string
		ours   func(float64) float64
		std    func(float64) float64
		lo, hi float64
		tol    uint64
	}{
		{"Exp", Exp, math.Exp, -700, 700, 2},
		{"Exp near 0", Exp, math.Exp, -1e-6, 1e-6, 1},
		{"Log", Log, math.Log, 1e-300, 1e300, 1},
		{"Log near 1", Log, math.Log, 0.5, 2, 1},
		{"Log1p", Log1p, math.Log1p, -0.999, 1e6, 1},
		{"Log1p small", Log1p, math.Log1p, -1e-8, 1e-8, 1},
		{"Tanh", Tanh, math.Tanh, -50, 50, 2},
		{"Tanh small", Tanh, math.Tanh, -0.7, 0.7, 2},
	} {
		worst := uint64(0)
		for range 100000 {
			x := c.lo + (c.hi-c.lo)*r.Float64()
			worst = max(worst, ulps(c.ours(x), c.std(x)))
		}
		if worst > c.tol {
			t.Errorf("%s: %d ulps from math's on [%g, %g], want at most %d", c.name, worst, c.lo, c.hi, c.tol)
		}
	}
}

func TestSpecialValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"Exp(+Inf)", Exp(inf), inf}, {"Exp(-Inf)", Exp(-inf), 0}, {"Exp(0)", Exp(0), 1},
		{"Exp(1000)", Exp(1000), inf}, {"Exp(-1000)", Exp(-1000), 0},
		{"Log(0)", Log(0), -inf}, {"Log(1)", Log(1), 0}, {"Log(+Inf)", Log(inf), inf},
		{"Log1p(-1)", Log1p(-1), -inf}, {"Log1p(0)", Log1p(0), 0}, {"Log1p(+Inf)", Log1p(inf), inf},
		{"Tanh(0)", Tanh(0), 0}, {"Tanh(100)", Tanh(100), 1}, {"Tanh(-100)", Tanh(-100), -1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	for _, c := range []struct {
		name string
		got  float64
	}{
		{"Exp(NaN)", Exp(nan)}, {"Log(-1)", Log(-1)}, {"Log(NaN)", Log(nan)},
		{"Log1p(-2)", Log1p(-2)}, {"Tanh(NaN)", Tanh(nan)},
	} {
		if !math.IsNaN(c.got) {
			t.Errorf("%s = %v, want NaN", c.name, c.got)
		}
	}
}
