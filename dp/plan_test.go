package dp

import (
	"math"
	"testing"
)

// A plan meets both targets with the accountant's own numbers, and
// σ is the least that does (a slightly smaller σ overshoots one of them).
func TestPlanDPSGD(t *testing.T) {
	for _, c := range []struct {
		eps, roundEps, delta float64
		rows, rounds         int
	}{{6, 1, 1e-5, 800, 6}, {0.5, 0.5, 1e-5, 800, 6}} {
		p, err := PlanDPSGD(c.eps, c.roundEps, c.delta, c.rows, c.rounds, nil, Improved)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", p)
		if p.Epsilon > c.eps*(1+1e-6) || p.RoundEpsilon > c.roundEps*(1+1e-6) {
			t.Errorf("%+v: plan overspends (ε %v of %v, round %v of %v)", c, p.Epsilon, c.eps, p.RoundEpsilon, c.roundEps)
		}
		if math.Abs(p.Epsilon-c.eps) > 1e-3*c.eps && math.Abs(p.RoundEpsilon-c.roundEps) > 1e-3*c.roundEps {
			t.Errorf("%+v: neither target is met tightly (ε %v, round %v): σ is not the least", c, p.Epsilon, p.RoundEpsilon)
		}
		if p.Batch < 1 || p.Batch > c.rows || p.Q != float64(p.Batch)/float64(c.rows) || p.StepsPerRound < 1 {
			t.Errorf("%+v: plan %+v", c, p)
		}
	}
	if _, err := PlanDPSGD(1, 1, 1e-5, 0, 3, nil, Improved); err == nil {
		t.Error("0 rows accepted")
	}
	if _, err := PlanDPSGD(-1, 1, 1e-5, 10, 3, nil, Improved); err == nil {
		t.Error("negative ε accepted")
	}
}
