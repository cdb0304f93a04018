package fl

import (
	"crypto/ed25519"
	"math"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/dp"
)

// A silo-level round is charged as the plain Gaussian mechanism (q = 1),
// whatever sampling rate a run names, and the ε the ledger records for it
// equals an independent computation: the Gaussian's RDP α/(2σ²) per round,
// converted with Balle et al. 2020 Thm 21 over the ledger's orders, written
// out here without the accountant. The charge is also sound: the exact
// privacy profile of the Gaussian mechanism (Balle & Wang 2018),
// δ(ε) = Φ(1/(2σ) − εσ) − e^ε·Φ(−1/(2σ) − εσ) per round composed as one
// Gaussian with σ/√T, stays below the ledger's δ at the charged ε.
func TestSiloRoundChargedAsPlainGaussian(t *testing.T) {
	const delta = 1e-5
	l, err := dp.Create(filepath.Join(t.TempDir(), "ledger"), ed25519.NewKeyFromSeed(make([]byte, 32)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.DeclareBudget("d", 1e9, delta); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sigma  float64
		rounds int
	}{{1, 1}, {0.5, 1}, {4, 1}, {1, 100}, {20, 1000}} {
		p := Privacy{Unit: UnitSilo, Clip: 1, Sigma: c.sigma, SampleRate: 1}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		ms := p.Mechanisms(0)
		if len(ms) != 1 || ms[0].Q != 1 || ms[0].Steps != 1 || ms[0].Sigma != c.sigma {
			t.Fatalf("σ=%v: a silo-level round is priced %v, want one Gaussian release at q = 1", c.sigma, ms)
		}
		// c.rounds rounds as one charge of that many releases.
		m := ms[0]
		m.Steps = int64(c.rounds)
		e, err := l.Charge(dp.ChargeRequest{Dataset: "d", Consumer: "test", Mechanisms: []dp.Mechanism{m}})
		if err != nil {
			t.Fatal(err)
		}
		T := float64(c.rounds)
		want := math.Inf(1)
		for _, a := range dp.DefaultOrders() {
			r := T * a / (2 * c.sigma * c.sigma)
			if eps := r + math.Log((a-1)/a) - (math.Log(delta)+math.Log(a))/(a-1); eps < want {
				want = eps
			}
		}
		got := e.Charge.Epsilon
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("σ=%v, %d rounds: charged ε = %.12g, independent computation %.12g", c.sigma, c.rounds, got, want)
		}
		// Soundness against the exact profile of the composed Gaussian.
		s := c.sigma / math.Sqrt(T)
		phi := func(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }
		if d := phi(1/(2*s)-got*s) - math.Exp(got)*phi(-1/(2*s)-got*s); d > delta {
			t.Errorf("σ=%v, %d rounds: at the charged ε = %g the exact δ is %g > %g: undercharged", c.sigma, c.rounds, got, d, delta)
		}
	}
}
