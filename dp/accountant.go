package dp

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/scellis/scellis/diag"
)

// This file is the Rényi-DP accountant for the Poisson-subsampled Gaussian
// mechanism (Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of the
// Sampled Gaussian Mechanism"). All sums run in log space.
//
// Integer orders use the exact finite binomial expansion (MTZ §3.3, eq. for
// A_α with integer α). Fractional orders use the two-sided infinite series of
// MTZ §3.3 (the form TF Privacy's _compute_log_a_frac and Opacus's
// _compute_log_a_frac implement), summed until both tails fall below e^-30
// relative contribution. The two agree with the published reference values to
// 1e-4 relative at fractional orders and to 1e-9 at integer orders.

// Conversion chooses how an RDP curve becomes an (ε, δ) guarantee.
type Conversion int

const (
	// Improved is the conversion of Balle, Barthe, Gaboardi, Hsu, Sato
	// (AISTATS 2020, Thm 21), used by Opacus and TF Privacy:
	// ε = r + log((α−1)/α) − (log δ + log α)/(α−1). It is never worse than
	// Classic and is the default.
	Improved Conversion = iota
	// Classic is Mironov 2017, Prop. 3: ε = r + log(1/δ)/(α−1).
	Classic
)

func (c Conversion) String() string {
	switch c {
	case Improved:
		return "improved"
	case Classic:
		return "classic"
	}
	return fmt.Sprintf("Conversion(%d)", int(c))
}

// ParseConversion parses "improved" or "classic".
func ParseConversion(s string) (Conversion, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "improved", "":
		return Improved, nil
	case "classic":
		return Classic, nil
	}
	return 0, diag.New(diag.DPUnknownConversion, "conversion", "unknown RDP to (ε, δ) conversion %q", s).
		WithHelp("use classic or improved")
}

// DefaultOrders returns the default grid of Rényi orders: 1.1, 1.2, …, 10.9
// and the integers 12 … 63 (the grid of Opacus's RDP accountant). The slice
// is a fresh copy the caller may modify.
func DefaultOrders() []float64 {
	out := make([]float64, 0, 99+52)
	for x := 1; x < 100; x++ {
		out = append(out, 1+float64(x)/10)
	}
	for a := 12; a < 64; a++ {
		out = append(out, float64(a))
	}
	return out
}

// MechanismSubsampledGaussian is the kind of the Poisson-subsampled Gaussian
// mechanism (with Q = 1, the plain Gaussian mechanism).
const MechanismSubsampledGaussian = "subsampled-gaussian"

// Mechanism is one privacy mechanism applied Steps times: each step includes
// every record independently with probability Q (Poisson sampling), clips
// each record's contribution to L2 norm C and adds N(0, (Sigma·C)²) noise to
// the sum. Sigma is the noise multiplier (noise standard deviation over
// sensitivity), so C itself does not enter the accounting.
type Mechanism struct {
	Kind  string  `cbor:"kind" json:"kind"`
	Sigma float64 `cbor:"sigma" json:"sigma"`
	Q     float64 `cbor:"q" json:"q"`
	Steps int64   `cbor:"steps" json:"steps"`
}

// SubsampledGaussian returns the mechanism of steps Poisson-subsampled
// Gaussian steps with sampling rate q and noise multiplier sigma.
func SubsampledGaussian(sigma, q float64, steps int64) Mechanism {
	return Mechanism{Kind: MechanismSubsampledGaussian, Sigma: sigma, Q: q, Steps: steps}
}

// maxSteps bounds Steps so that products with it stay exact enough.
const maxSteps = 1 << 40

// Validate checks the parameters and returns a diagnostic naming the first
// bad one: σ must be positive and finite, q in (0, 1], steps ≥ 1.
func (m Mechanism) Validate() error {
	if m.Kind != MechanismSubsampledGaussian {
		return diag.New(diag.DPUnknownMechanism, "mechanism", "unknown mechanism %q", m.Kind).
			WithHelp("the accountant knows %q", MechanismSubsampledGaussian)
	}
	if err := checkSigma(m.Sigma); err != nil {
		return err
	}
	if err := checkQ(m.Q); err != nil {
		return err
	}
	if m.Steps < 1 || m.Steps > maxSteps {
		return diag.New(diag.DPBadSteps, "steps", "number of steps %d is outside [1, 2^40]", m.Steps).
			WithHelp("give a positive number of steps")
	}
	return nil
}

func (m Mechanism) String() string {
	return fmt.Sprintf("%s(sigma=%g, q=%g, steps=%d)", m.Kind, m.Sigma, m.Q, m.Steps)
}

// RDP returns the Rényi-DP curve of m at the given orders: element i is the
// RDP ε of all m.Steps steps at order orders[i].
func (m Mechanism) RDP(orders []float64) ([]float64, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if err := CheckOrders(orders); err != nil {
		return nil, err
	}
	out := make([]float64, len(orders))
	for i, a := range orders {
		out[i] = float64(m.Steps) * rdpSampledGaussian(m.Q, m.Sigma, a)
	}
	return out, nil
}

// RDPSubsampledGaussian returns the RDP curve of steps compositions of the
// Poisson-subsampled Gaussian mechanism with rate q and noise multiplier
// sigma, at each order.
func RDPSubsampledGaussian(q, sigma float64, steps int64, orders []float64) ([]float64, error) {
	return SubsampledGaussian(sigma, q, steps).RDP(orders)
}

func checkSigma(s float64) error {
	if !(s > 0) || math.IsInf(s, 0) {
		return diag.New(diag.DPBadSigma, "sigma", "noise multiplier σ=%v must be positive and finite", s).
			WithHelp("σ is the noise standard deviation divided by the clipping bound, e.g. 1.1")
	}
	return nil
}

func checkQ(q float64) error {
	if !(q > 0 && q <= 1) {
		return diag.New(diag.DPBadQ, "q", "sampling rate q=%v is outside (0, 1]", q).
			WithHelp("q is the expected batch size divided by the dataset size; 1 means every record every step")
	}
	return nil
}

func checkDelta(d float64) error {
	if !(d > 0 && d < 1) {
		return diag.New(diag.DPBadDelta, "delta", "δ=%v is outside (0, 1)", d).
			WithHelp("δ should be well below 1/n for n records, e.g. 1e-5")
	}
	return nil
}

func checkEpsilon(e float64) error {
	if !(e >= 0) || math.IsInf(e, 0) {
		return diag.New(diag.DPBadEpsilon, "epsilon", "ε=%v must be a finite, non-negative number", e).
			WithHelp("give a privacy budget such as 1 or 8")
	}
	return nil
}

// CheckOrders checks an order grid: 1 to 1024 orders, every order finite
// and > 1, no duplicates.
func CheckOrders(orders []float64) error {
	if len(orders) == 0 {
		return diag.New(diag.DPBadOrder, "orders", "the order grid is empty").
			WithHelp("omit the orders to use the default grid")
	}
	if len(orders) > maxOrders {
		return diag.New(diag.DPBadOrder, "orders", "%d orders given, at most %d are allowed", len(orders), maxOrders).
			WithHelp("the default grid has 151 orders; a few dozen well-spread orders suffice")
	}
	seen := make(map[float64]bool, len(orders))
	for _, a := range orders {
		if !(a > 1) || math.IsInf(a, 0) || a > 1e6 {
			return diag.New(diag.DPBadOrder, "orders", "Rényi order %v is not in (1, 10^6]", a).
				WithHelp("orders must be finite numbers greater than 1, e.g. 1.5,2,4,8,16,32,64")
		}
		if seen[a] {
			return diag.New(diag.DPBadOrder, "orders", "Rényi order %v is given twice", a)
		}
		seen[a] = true
	}
	return nil
}

// rdpSampledGaussian is the RDP of one step at order alpha.
func rdpSampledGaussian(q, sigma, alpha float64) float64 {
	if q == 1 {
		return alpha / (2 * sigma * sigma)
	}
	var logA float64
	if alpha == math.Trunc(alpha) && alpha <= 1<<20 {
		logA = logAInt(q, sigma, int(alpha))
	} else {
		logA = logAFrac(q, sigma, alpha)
	}
	r := logA / (alpha - 1)
	if r < 0 || math.IsNaN(r) {
		// A_α ≥ 1 mathematically; rounding can give −1e-18. NaN would mean a
		// numerical failure: be conservative.
		if math.IsNaN(r) {
			return math.Inf(1)
		}
		return 0
	}
	return r
}

// logAInt computes log A_α for integer α ≥ 2:
// A_α = Σ_{i=0}^{α} C(α,i) (1−q)^{α−i} q^i exp((i²−i)/(2σ²)).
func logAInt(q, sigma float64, alpha int) float64 {
	logQ, log1Q := math.Log(q), math.Log1p(-q)
	s2 := 2 * sigma * sigma
	a := float64(alpha)
	lgA, _ := math.Lgamma(a + 1)
	acc := math.Inf(-1)
	for i := 0; i <= alpha; i++ {
		fi := float64(i)
		lgI, _ := math.Lgamma(fi + 1)
		lgJ, _ := math.Lgamma(a - fi + 1)
		t := lgA - lgI - lgJ + fi*logQ + (a-fi)*log1Q + (fi*fi-fi)/s2
		acc = logAdd(acc, t)
	}
	return acc
}

// maxSeriesTerms bounds the fractional-order series; past it the result is
// reported as +Inf (no privacy claimed), which is conservative.
const maxSeriesTerms = 1 << 20

// logAFrac computes log A_α for fractional α by the MTZ series.
func logAFrac(q, sigma, alpha float64) float64 {
	logQ, log1Q := math.Log(q), math.Log1p(-q)
	s2 := sigma * sigma
	z0 := s2*math.Log(1/q-1) + 0.5
	lgA, _ := math.Lgamma(alpha + 1)
	a0, a1 := math.Inf(-1), math.Inf(-1)
	for i := 0; ; i++ {
		if i >= maxSeriesTerms {
			return math.Inf(1)
		}
		fi := float64(i)
		j := alpha - fi
		lgI, _ := math.Lgamma(fi + 1)
		lgJ, sign := math.Lgamma(j + 1)
		logCoef := lgA - lgI - lgJ
		t0 := logCoef + fi*logQ + j*log1Q
		t1 := logCoef + j*logQ + fi*log1Q
		e0 := math.Log(0.5) + logErfc((fi-z0)/(math.Sqrt2*sigma))
		e1 := math.Log(0.5) + logErfc((z0-j)/(math.Sqrt2*sigma))
		s0 := t0 + (fi*fi-fi)/(2*s2) + e0
		s1 := t1 + (j*j-j)/(2*s2) + e1
		if sign > 0 {
			a0 = logAdd(a0, s0)
			a1 = logAdd(a1, s1)
		} else {
			a0 = logSub(a0, s0)
			a1 = logSub(a1, s1)
		}
		if math.Max(s0, s1) < -30 {
			break
		}
	}
	return logAdd(a0, a1)
}

// logAdd returns log(e^a + e^b).
func logAdd(a, b float64) float64 {
	hi, lo := math.Max(a, b), math.Min(a, b)
	if math.IsInf(hi, -1) {
		return hi
	}
	return hi + math.Log1p(math.Exp(lo-hi))
}

// logSub returns log(e^a − e^b) for a ≥ b; −Inf when they are equal. A
// negative difference (rounding in a series) is clamped to −Inf, matching the
// reference implementations.
func logSub(a, b float64) float64 {
	if b > a {
		return math.Inf(-1)
	}
	if math.IsInf(b, -1) {
		return a
	}
	if a == b {
		return math.Inf(-1)
	}
	d := b - a
	return a + math.Log(-math.Expm1(d))
}

// logErfc returns log(erfc(x)), accurate also where erfc(x) underflows.
func logErfc(x float64) float64 {
	if x < 20 {
		return math.Log(math.Erfc(x))
	}
	// Asymptotic expansion: erfc(x) = e^{-x²}/(x√π) · (1 − 1/(2x²) + 3/(4x⁴) − …).
	x2 := x * x
	r := 1 / (2 * x2)
	series := 1 - r + 3*r*r - 15*r*r*r + 105*r*r*r*r
	return -x2 - math.Log(x) - 0.5*math.Log(math.Pi) + math.Log(series)
}

// Epsilon converts an RDP curve to (ε, δ)-DP, minimising over the orders. It
// returns ε and the order that attains it.
func Epsilon(orders, rdp []float64, delta float64, conv Conversion) (eps, order float64, err error) {
	if err := CheckOrders(orders); err != nil {
		return 0, 0, err
	}
	if len(rdp) != len(orders) {
		return 0, 0, fmt.Errorf("dp: %d RDP values for %d orders", len(rdp), len(orders))
	}
	if err := checkDelta(delta); err != nil {
		return 0, 0, err
	}
	if conv != Improved && conv != Classic {
		return 0, 0, fmt.Errorf("dp: unknown conversion %v", conv)
	}
	eps, order = math.Inf(1), math.NaN()
	logD := math.Log(delta)
	for i, a := range orders {
		r := rdp[i]
		if math.IsNaN(r) || r < 0 {
			return 0, 0, fmt.Errorf("dp: invalid RDP value %v at order %v", r, a)
		}
		var e float64
		switch conv {
		case Classic:
			e = r - logD/(a-1)
		case Improved:
			e = r + math.Log1p(-1/a) - (logD+math.Log(a))/(a-1)
		}
		if e < eps {
			eps, order = e, a
		}
	}
	if eps < 0 {
		eps = 0
	}
	return eps, order, nil
}

// Accountant composes mechanisms in RDP space on a fixed order grid. Composition
// is the element-wise sum of RDP curves. An Accountant is not safe for
// concurrent use.
type Accountant struct {
	orders []float64
	rdp    []float64
}

// NewAccountant returns an empty accountant on the given orders (nil means
// DefaultOrders).
func NewAccountant(orders []float64) (*Accountant, error) {
	if orders == nil {
		orders = DefaultOrders()
	}
	if err := CheckOrders(orders); err != nil {
		return nil, err
	}
	return &Accountant{orders: slices.Clone(orders), rdp: make([]float64, len(orders))}, nil
}

// Orders returns the accountant's order grid.
func (a *Accountant) Orders() []float64 { return slices.Clone(a.orders) }

// RDP returns the composed RDP curve so far.
func (a *Accountant) RDP() []float64 { return slices.Clone(a.rdp) }

// Compose adds the RDP curve of m.
func (a *Accountant) Compose(m Mechanism) error {
	c, err := m.RDP(a.orders)
	if err != nil {
		return err
	}
	return a.AddRDP(c)
}

// AddRDP adds a precomputed RDP curve on the accountant's orders.
func (a *Accountant) AddRDP(curve []float64) error {
	if len(curve) != len(a.rdp) {
		return fmt.Errorf("dp: RDP curve has %d values, accountant has %d orders", len(curve), len(a.rdp))
	}
	for i, v := range curve {
		if math.IsNaN(v) || v < 0 {
			return fmt.Errorf("dp: invalid RDP value %v at order %v", v, a.orders[i])
		}
	}
	for i, v := range curve {
		a.rdp[i] += v
	}
	return nil
}

// Epsilon returns the (ε, δ) guarantee of everything composed so far.
func (a *Accountant) Epsilon(delta float64, conv Conversion) (eps, order float64, err error) {
	return Epsilon(a.orders, a.rdp, delta, conv)
}

// calibrateTolerance is the relative precision of Calibrate's σ.
const calibrateTolerance = 1e-9

// Calibrate returns the smallest noise multiplier σ (to relative precision
// 1e-9, rounded up so the target is met) for which steps compositions of the
// Poisson-subsampled Gaussian with rate q satisfy (targetEps, delta)-DP.
// orders nil means DefaultOrders.
func Calibrate(targetEps, delta, q float64, steps int64, orders []float64, conv Conversion) (sigma float64, err error) {
	return CalibrateAfter(targetEps, delta, q, steps, nil, orders, conv)
}

// CalibrateAfter is Calibrate for steps that compose with other
// mechanisms of the same run: base is their RDP on orders (nil: none),
// and σ is the smallest for which base plus the steps meets (targetEps,
// delta). A base that alone exceeds the target is DPUnreachable.
func CalibrateAfter(targetEps, delta, q float64, steps int64, base, orders []float64, conv Conversion) (sigma float64, err error) {
	if err := checkEpsilon(targetEps); err != nil {
		return 0, err
	}
	if targetEps == 0 {
		return 0, diag.New(diag.DPUnreachable, "epsilon", "ε=0 cannot be met by any finite noise").
			WithHelp("give a positive target ε")
	}
	if err := checkDelta(delta); err != nil {
		return 0, err
	}
	if orders == nil {
		orders = DefaultOrders()
	}
	if err := CheckOrders(orders); err != nil {
		return 0, err
	}
	if base != nil && len(base) != len(orders) {
		return 0, fmt.Errorf("dp: %d RDP values for %d orders", len(base), len(orders))
	}
	epsAt := func(s float64) (float64, error) {
		c, err := SubsampledGaussian(s, q, steps).RDP(orders)
		if err != nil {
			return 0, err
		}
		for i, v := range base {
			c[i] += v
		}
		e, _, err := Epsilon(orders, c, delta, conv)
		return e, err
	}
	// Bracket: lo fails the target, hi meets it.
	lo, hi := 0.0, 1.0
	for {
		e, err := epsAt(hi)
		if err != nil {
			return 0, err
		}
		if e <= targetEps {
			break
		}
		lo = hi
		hi *= 2
		if hi > 1e6 {
			return 0, diag.New(diag.DPUnreachable, "epsilon",
				"no noise multiplier up to 1e6 reaches ε=%v at δ=%v with q=%v over %d steps", targetEps, delta, q, steps).
				WithHelp("raise the target ε or δ, lower q, or run fewer steps")
		}
	}
	if lo == 0 {
		// Search down for a failing lower end.
		lo = hi / 2
		for {
			e, err := epsAt(lo)
			if err != nil {
				return 0, err
			}
			if e > targetEps {
				break
			}
			hi = lo
			lo /= 2
			if lo < 1e-6 {
				return hi, nil
			}
		}
	}
	for (hi-lo)/hi > calibrateTolerance {
		mid := lo + (hi-lo)/2
		e, err := epsAt(mid)
		if err != nil {
			return 0, err
		}
		if e <= targetEps {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// MaxSteps returns the largest number of steps T of the Poisson-subsampled
// Gaussian (rate q, noise multiplier sigma) that can be composed with the RDP
// already spent (on orders) without the total exceeding budgetEps at delta.
// It returns 0 when not even one step fits.
func MaxSteps(orders, spent []float64, q, sigma, budgetEps, delta float64, conv Conversion) (int64, error) {
	if err := checkEpsilon(budgetEps); err != nil {
		return 0, err
	}
	if len(spent) != len(orders) {
		return 0, fmt.Errorf("dp: %d RDP values for %d orders", len(spent), len(orders))
	}
	step, err := SubsampledGaussian(sigma, q, 1).RDP(orders)
	if err != nil {
		return 0, err
	}
	total := make([]float64, len(orders))
	fits := func(t int64) (bool, error) {
		for i := range total {
			total[i] = spent[i] + float64(t)*step[i]
		}
		e, _, err := Epsilon(orders, total, delta, conv)
		return e <= budgetEps, err
	}
	ok, err := fits(1)
	if err != nil || !ok {
		return 0, err
	}
	lo, hi := int64(1), int64(2)
	for {
		ok, err := fits(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo = hi
		if hi >= maxSteps {
			return maxSteps, nil
		}
		hi *= 2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := fits(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}
