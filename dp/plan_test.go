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

// A plan that shares the budget with other releases (a statistics step,
// evaluations) composes them in: its Epsilon is the whole run's, within
// the target, and its σ is above the plan's without them.
func TestPlanDPSGDAfter(t *testing.T) {
	orders := DefaultOrders()
	stats, err := SubsampledGaussian(8, 1, 2).RDP(orders)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := PlanDPSGD(4, 4, 1e-5, 800, 10, nil, Improved)
	if err != nil {
		t.Fatal(err)
	}
	with, err := PlanDPSGDAfter(4, 4, 1e-5, 800, 10, stats, nil, Improved)
	if err != nil {
		t.Fatal(err)
	}
	if !(with.Sigma > alone.Sigma) || with.Epsilon > 4*(1+1e-6) || math.Abs(with.Epsilon-4) > 4e-3 {
		t.Fatalf("alone %+v, with the statistics %+v", alone, with)
	}
	// CalibrateAfter's σ is the least: composed with the base, it meets
	// the target, and a little less noise does not.
	sigma, err := CalibrateAfter(2, 1e-5, 1, 5, stats, nil, Improved)
	if err != nil {
		t.Fatal(err)
	}
	epsAt := func(s float64) float64 {
		c, _ := SubsampledGaussian(s, 1, 5).RDP(orders)
		for i := range c {
			c[i] += stats[i]
		}
		e, _, _ := Epsilon(orders, c, 1e-5, Improved)
		return e
	}
	if epsAt(sigma) > 2 || epsAt(sigma*(1-1e-6)) <= 2 {
		t.Fatalf("σ = %v: ε %v, slightly less noise %v", sigma, epsAt(sigma), epsAt(sigma*(1-1e-6)))
	}
	// A base that alone spends more than the target leaves nothing.
	if _, err := CalibrateAfter(0.5, 1e-5, 1, 5, stats, nil, Improved); err == nil {
		t.Fatal("a base above the target was accepted")
	}
}
