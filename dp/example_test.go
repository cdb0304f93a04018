package dp_test

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

// The accountant: ε of DP-SGD with noise multiplier 1.5, sampling rate 0.04
// and 2250 steps at δ = 1e-5 (Opacus's reference case).
func ExampleRDPSubsampledGaussian() {
	orders := dp.DefaultOrders()
	rdp, err := dp.RDPSubsampledGaussian(0.04, 1.5, 2250, orders)
	if err != nil {
		panic(err)
	}
	eps, order, _ := dp.Epsilon(orders, rdp, 1e-5, dp.Improved)
	fmt.Printf("ε = %.5f at order %g\n", eps, order)
	// Output: ε = 7.32911 at order 3.9
}

// Calibration: the noise multiplier that meets ε = 1 at δ = 1e-5 for 1000
// steps at q = 0.01.
func ExampleCalibrate() {
	sigma, err := dp.Calibrate(1, 1e-5, 0.01, 1000, nil, dp.Improved)
	if err != nil {
		panic(err)
	}
	fmt.Printf("σ = %.4f\n", sigma)
	// Output: σ = 1.5131
}

// Update-level DP at a silo: clip the update, put it on the secure-
// aggregation grid and add exact discrete Gaussian noise there; the
// release costs one Gaussian step at q = 1.
func ExampleGridGaussian() {
	g := dp.GridGaussian{Clip: 1, Sigma: 1.1, FracBits: 10, Dim: 2}
	y, err := g.Release([]float64{3, 4}, nil) // clipped to [0.6 0.8], then on the grid of 2^10
	if err != nil {
		panic(err)
	}
	fmt.Println(len(y), "integers; noise scale T =", g.NoiseScale(), "grid units; charge", g.Mechanisms()[0])
	// Output: 2 integers; noise scale T = 1127 grid units; charge subsampled-gaussian(sigma=1.1, q=1, steps=1)
}

// The ledger: declare a budget, charge before releasing, and be refused
// when the budget would be overdrawn.
func ExampleLedger() {
	dir, _ := os.MkdirTemp("", "ledger")
	defer os.RemoveAll(dir)
	_, key, _ := ed25519.GenerateKey(nil)
	l, err := dp.Create(filepath.Join(dir, "privacy.ledger"), key, nil)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	l.DeclareBudget("icu-2024", 1, 1e-5)

	round := dp.ChargeRequest{Dataset: "icu-2024", Consumer: "round-1",
		Mechanisms: []dp.Mechanism{dp.SubsampledGaussian(3, 0.01, 1000)}}
	e, err := l.Charge(round)
	if err != nil {
		panic(err)
	}
	fmt.Printf("entry %d: ε %.3f, cumulative %.3f\n", e.Seq, e.Charge.Epsilon, e.Charge.Cumulative)
	// The update may leave the silo now: the charge is fsync'd.

	greedy := dp.ChargeRequest{Dataset: "icu-2024", Consumer: "round-2",
		Mechanisms: []dp.Mechanism{dp.SubsampledGaussian(0.8, 0.1, 1000)}}
	_, err = l.Charge(greedy)
	if ds, ok := diag.As(err); ok {
		fmt.Println("refused:", ds[0].Code)
	}
	// Output:
	// entry 2: ε 0.419, cumulative 0.419
	// refused: SC5010
}
