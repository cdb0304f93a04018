package dp

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/scellis/scellis/diag"
)

func relErr(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }

func ordersRange(lo, hi int) []float64 {
	var o []float64
	for a := lo; a <= hi; a++ {
		o = append(o, float64(a))
	}
	return o
}

// Opacus's accountant test: σ=1.5, q=0.04, 2250 steps, δ=1e-5 on the default
// grid with the improved conversion gives ε = 7.32911.
func TestPublishedOpacus(t *testing.T) {
	c, err := RDPSubsampledGaussian(0.04, 1.5, 2250, DefaultOrders())
	if err != nil {
		t.Fatal(err)
	}
	eps, order, err := Epsilon(DefaultOrders(), c, 1e-5, Improved)
	if err != nil {
		t.Fatal(err)
	}
	if relErr(eps, 7.32911) > 1e-6 {
		t.Fatalf("ε = %.9g at order %v, want 7.32911", eps, order)
	}
}

// Abadi et al. 2016 / TF Privacy: σ=4, q=0.01, 10000 steps, δ=1e-5, orders
// 2..32, classic conversion gives ε = 1.258575.
func TestPublishedAbadi(t *testing.T) {
	o := ordersRange(2, 32)
	c, err := RDPSubsampledGaussian(0.01, 4, 10000, o)
	if err != nil {
		t.Fatal(err)
	}
	eps, _, err := Epsilon(o, c, 1e-5, Classic)
	if err != nil {
		t.Fatal(err)
	}
	if relErr(eps, 1.258575) > 1e-6 {
		t.Fatalf("ε = %.9g, want 1.258575", eps)
	}
}

// TF Privacy's testComputeRdpSequence: q=0.01, σ=2.5, 50 steps. The published
// values hold to 1e-4 relative (as in their test). The exact values, from a
// 40-digit mpmath quadrature of the MTZ integral (fractional orders) and the
// exact binomial sum (integer orders), hold to 1e-9: the published 1.0854871e-3
// at order 2.5 is itself 6e-5 off.
func TestPublishedRDPSequence(t *testing.T) {
	orders := []float64{1.5, 2.5, 5, 50, 100}
	published := []float64{6.5007e-4, 1.08548710e-3, 2.18075656e-3, 2.38460375e-2, 1.67416308e2}
	exact := []float64{6.50070897188e-4, 1.08541805692e-3, 2.18075656231e-3, 2.38460375387062e-2, 167.416307548418}
	c, err := RDPSubsampledGaussian(0.01, 2.5, 50, orders)
	if err != nil {
		t.Fatal(err)
	}
	for i := range orders {
		if e := relErr(c[i], published[i]); e > 1e-4 {
			t.Errorf("order %v: RDP %.9e, published %.9e (rel %.1e)", orders[i], c[i], published[i], e)
		}
		if e := relErr(c[i], exact[i]); e > 1e-9 {
			t.Errorf("order %v: RDP %.12e, exact %.12e (rel %.1e)", orders[i], c[i], exact[i], e)
		}
	}
}

// A dumb reference: integrate the MTZ definition
// A_α = E_{z~N(0,σ²)}[((1−q) + q·exp((2z−1)/(2σ²)))^α] by the trapezoid rule.
func rdpByQuadrature(q, sigma, alpha float64) float64 {
	lo, hi := -40*sigma, alpha+40*sigma
	h := sigma / 64
	s2 := sigma * sigma
	var sum float64
	n := int((hi - lo) / h)
	for k := 0; k <= n; k++ {
		z := lo + float64(k)*h
		mu0 := math.Exp(-z*z/(2*s2)) / (sigma * math.Sqrt(2*math.Pi))
		l := math.Exp((2*z - 1) / (2 * s2))
		g := mu0 * math.Expm1(alpha*math.Log1p(q*(l-1)))
		if k == 0 || k == n {
			g /= 2
		}
		sum += g
	}
	return math.Log1p(sum*h) / (alpha - 1)
}

func TestRDPAgainstQuadrature(t *testing.T) {
	r := rand.New(rand.NewChaCha8([32]byte{1}))
	for i := 0; i < 40; i++ {
		q := math.Exp(-1 - 6*r.Float64()) // 0.0009 .. 0.37
		sigma := 0.8 + 5*r.Float64()
		alpha := 1.05 + 20*r.Float64()
		if i%4 == 0 {
			alpha = math.Round(alpha) + 1
		}
		got := rdpSampledGaussian(q, sigma, alpha)
		want := rdpByQuadrature(q, sigma, alpha)
		if relErr(got, want) > 1e-6 {
			t.Errorf("q=%v σ=%v α=%v: series %.10e, quadrature %.10e", q, sigma, alpha, got, want)
		}
	}
}

func TestFullBatchIsGaussian(t *testing.T) {
	o := []float64{1.5, 2, 10}
	c, _ := RDPSubsampledGaussian(1, 2, 3, o)
	for i, a := range o {
		if want := 3 * a / (2 * 4); relErr(c[i], want) > 1e-15 {
			t.Errorf("order %v: %v, want %v", a, c[i], want)
		}
	}
}

func epsOf(t *testing.T, sigma, q float64, steps int64) float64 {
	t.Helper()
	c, err := RDPSubsampledGaussian(q, sigma, steps, DefaultOrders())
	if err != nil {
		t.Fatal(err)
	}
	e, _, err := Epsilon(DefaultOrders(), c, 1e-5, Improved)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ε grows with steps and q and shrinks with σ.
func TestEpsilonMonotone(t *testing.T) {
	r := rand.New(rand.NewChaCha8([32]byte{2}))
	for i := 0; i < 25; i++ {
		sigma := 0.6 + 4*r.Float64()
		q := 0.001 + 0.3*r.Float64()
		steps := int64(1 + r.IntN(5000))
		e := epsOf(t, sigma, q, steps)
		if e2 := epsOf(t, sigma, q, steps+1+int64(r.IntN(1000))); e2 < e {
			t.Errorf("more steps lowered ε: %v < %v (σ=%v q=%v T=%d)", e2, e, sigma, q, steps)
		}
		if e2 := epsOf(t, sigma, math.Min(1, q*(1.01+r.Float64())), steps); e2 < e {
			t.Errorf("higher q lowered ε: %v < %v", e2, e)
		}
		if e2 := epsOf(t, sigma*(1.01+r.Float64()), q, steps); e2 > e {
			t.Errorf("more noise raised ε: %v > %v", e2, e)
		}
	}
}

// Composing mechanisms sums their RDP curves; composing T1 and T2 steps of one
// mechanism equals T1+T2 steps.
func TestCompositionIsSum(t *testing.T) {
	a, _ := NewAccountant(nil)
	m1, m2 := SubsampledGaussian(1.1, 0.02, 300), SubsampledGaussian(3, 0.5, 10)
	if err := a.Compose(m1); err != nil {
		t.Fatal(err)
	}
	if err := a.Compose(m2); err != nil {
		t.Fatal(err)
	}
	c1, _ := m1.RDP(DefaultOrders())
	c2, _ := m2.RDP(DefaultOrders())
	got := a.RDP()
	for i := range got {
		if got[i] != c1[i]+c2[i] {
			t.Fatalf("order %v: composed %v, sum %v", a.orders[i], got[i], c1[i]+c2[i])
		}
	}
	b, _ := NewAccountant(nil)
	b.Compose(SubsampledGaussian(1.1, 0.02, 100))
	b.Compose(SubsampledGaussian(1.1, 0.02, 200))
	for i, v := range b.RDP() {
		if relErr(v, c1[i]) > 1e-12 {
			t.Fatalf("order %v: 100+200 steps %v, 300 steps %v", a.orders[i], v, c1[i])
		}
	}
	e, _, _ := a.Epsilon(1e-5, Improved)
	e1, _, _ := Epsilon(DefaultOrders(), c1, 1e-5, Improved)
	e2, _, _ := Epsilon(DefaultOrders(), c2, 1e-5, Improved)
	if e > e1+e2 || e < math.Max(e1, e2) {
		t.Fatalf("composed ε %v outside [max, sum] = [%v, %v]", e, math.Max(e1, e2), e1+e2)
	}
}

func TestImprovedNeverWorse(t *testing.T) {
	c, _ := RDPSubsampledGaussian(0.01, 1, 1000, DefaultOrders())
	ei, _, _ := Epsilon(DefaultOrders(), c, 1e-6, Improved)
	ec, _, _ := Epsilon(DefaultOrders(), c, 1e-6, Classic)
	if ei > ec {
		t.Fatalf("improved %v > classic %v", ei, ec)
	}
}

func TestCalibrate(t *testing.T) {
	for _, tc := range []struct {
		eps, q float64
		steps  int64
	}{{1, 0.01, 1000}, {8, 0.04, 2250}, {0.5, 1, 1}, {3, 0.001, 100000}} {
		s, err := Calibrate(tc.eps, 1e-5, tc.q, tc.steps, nil, Improved)
		if err != nil {
			t.Fatal(err)
		}
		if e := epsOf(t, s, tc.q, tc.steps); e > tc.eps {
			t.Errorf("%+v: σ=%v gives ε=%v over the target", tc, s, e)
		}
		if e := epsOf(t, s*(1-1e-6), tc.q, tc.steps); e <= tc.eps {
			t.Errorf("%+v: σ=%v is not the smallest (ε at 1-1e-6 is %v)", tc, s, e)
		}
	}
	if _, err := Calibrate(1e-9, 1e-5, 1, 1e6, nil, Improved); err == nil {
		t.Fatal("an unreachable target was met")
	} else if ds, ok := diag.As(err); !ok || ds[0].Code != diag.DPUnreachable {
		t.Fatalf("unreachable target: %v", err)
	}
}

func TestMaxSteps(t *testing.T) {
	o := DefaultOrders()
	spent, _ := RDPSubsampledGaussian(0.02, 1.2, 500, o)
	n, err := MaxSteps(o, spent, 0.02, 1.2, 3, 1e-5, Improved)
	if err != nil {
		t.Fatal(err)
	}
	eps := func(extra int64) float64 {
		c, _ := RDPSubsampledGaussian(0.02, 1.2, 500+extra, o)
		e, _, _ := Epsilon(o, c, 1e-5, Improved)
		return e
	}
	if n <= 0 || eps(n) > 3 || eps(n+1) <= 3 {
		t.Fatalf("MaxSteps = %d: ε(n)=%v ε(n+1)=%v, budget 3", n, eps(n), eps(n+1))
	}
	if n, _ := MaxSteps(o, spent, 0.02, 1.2, 0.01, 1e-5, Improved); n != 0 {
		t.Fatalf("a spent budget allows %d steps", n)
	}
}

func TestBadInputIsDiagnosed(t *testing.T) {
	o := DefaultOrders()
	cases := []struct {
		name string
		err  error
		code diag.Code
	}{
		{"sigma 0", errOf(RDPSubsampledGaussian(0.1, 0, 1, o)), diag.DPBadSigma},
		{"sigma NaN", errOf(RDPSubsampledGaussian(0.1, math.NaN(), 1, o)), diag.DPBadSigma},
		{"sigma -1", errOf(RDPSubsampledGaussian(0.1, -1, 1, o)), diag.DPBadSigma},
		{"q 0", errOf(RDPSubsampledGaussian(0, 1, 1, o)), diag.DPBadQ},
		{"q 1.5", errOf(RDPSubsampledGaussian(1.5, 1, 1, o)), diag.DPBadQ},
		{"q NaN", errOf(RDPSubsampledGaussian(math.NaN(), 1, 1, o)), diag.DPBadQ},
		{"steps 0", errOf(RDPSubsampledGaussian(0.1, 1, 0, o)), diag.DPBadSteps},
		{"order 1", errOf(RDPSubsampledGaussian(0.1, 1, 1, []float64{1})), diag.DPBadOrder},
		{"order Inf", errOf(RDPSubsampledGaussian(0.1, 1, 1, []float64{math.Inf(1)})), diag.DPBadOrder},
		{"order dup", errOf(RDPSubsampledGaussian(0.1, 1, 1, []float64{2, 2})), diag.DPBadOrder},
		{"no orders", errOf(RDPSubsampledGaussian(0.1, 1, 1, []float64{})), diag.DPBadOrder},
		{"delta 0", errOf3(Epsilon(o, make([]float64, len(o)), 0, Improved)), diag.DPBadDelta},
		{"delta 1", errOf3(Epsilon(o, make([]float64, len(o)), 1, Improved)), diag.DPBadDelta},
		{"eps -1", errOf(Calibrate(-1, 1e-5, 0.1, 10, nil, Improved)), diag.DPBadEpsilon},
		{"eps NaN", errOf(Calibrate(math.NaN(), 1e-5, 0.1, 10, nil, Improved)), diag.DPBadEpsilon},
		{"conversion", errOf(ParseConversion("fancy")), diag.DPUnknownConversion},
		{"mechanism", Mechanism{Kind: "laplace", Sigma: 1, Q: 1, Steps: 1}.Validate(), diag.DPUnknownMechanism},
	}
	for _, tc := range cases {
		ds, ok := diag.As(tc.err)
		if !ok || ds[0].Code != tc.code {
			t.Errorf("%s: got %v, want a %s diagnostic", tc.name, tc.err, tc.code)
		}
	}
}

func errOf[T any](_ T, err error) error          { return err }
func errOf3[A, B any](_ A, _ B, err error) error { return err }

func BenchmarkAccountant100kSteps(b *testing.B) {
	o := DefaultOrders()
	for b.Loop() {
		c, _ := RDPSubsampledGaussian(0.01, 1.1, 100000, o)
		Epsilon(o, c, 1e-5, Improved)
	}
}

func BenchmarkCalibrate(b *testing.B) {
	for b.Loop() {
		Calibrate(1, 1e-5, 0.01, 100000, nil, Improved)
	}
}
