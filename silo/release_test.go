package silo

import (
	"crypto/ed25519"
	"fmt"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// A silo refuses, before training or charging, a DP round whose sum would
// carry training metrics, whose grid is too fine for the noise sampler, or
// whose noise could exceed the ring's headroom (the secure sum would wrap).
func TestCheckReleaseRefusals(t *testing.T) {
	bundle := func(clip float64, grid int, metrics []string) fl.RoundBundle {
		b := fl.RoundBundle{Step: fl.StepTrain, UpdateDim: 4, Metrics: metrics, SecAgg: secagg.Params{Round: "r", Dim: 4 + len(metrics),
			Clip: clip, Weighted: true, MaxWeight: 1e9, GridBits: grid}}
		for i := range 3 {
			seed := make([]byte, ed25519.SeedSize)
			seed[0] = byte(i)
			b.SecAgg.Members = append(b.SecAgg.Members, secagg.Member{ID: fmt.Sprint("s", i), Key: ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)})
		}
		return b
	}
	silo := fl.Privacy{Unit: fl.UnitSilo, Clip: 1, Sigma: 1, GridBits: 10}
	code := func(err error) diag.Code {
		if ds, ok := diag.As(err); ok && len(ds) == 1 {
			return ds[0].Code
		}
		return ""
	}
	if err := checkRelease("r", silo, bundle(1e6, 10, nil)); err != nil {
		t.Fatalf("a round that fits refused: %v", err)
	}
	// The ring's per-site bound is clip·2^f = 1024 here: the encoded
	// update alone can reach it, so its noise cannot fit.
	if err := checkRelease("r", silo, bundle(1, 10, nil)); code(err) != diag.DPRingHeadroom {
		t.Fatalf("noise beyond the ring's headroom: %v, want %s", err, diag.DPRingHeadroom)
	}
	// Training metrics would leave unnoised.
	if err := checkRelease("r", silo, bundle(1e6, 10, fl.DefaultMetrics)); code(err) != diag.FLBadPrivacy {
		t.Fatalf("metrics summed under DP: %v, want %s", err, diag.FLBadPrivacy)
	}
	// A grid of 2^40 puts the clip at 2^40 units: the noise scale is
	// beyond the exact sampler's 64-bit range.
	fine := silo
	fine.GridBits = 40
	if err := checkRelease("r", fine, bundle(1e6, 0, nil)); code(err) != diag.DPBadGrid {
		t.Fatalf("a grid too fine for the noise: %v, want %s", err, diag.DPBadGrid)
	}
	// Without DP nothing is checked here (the own regime sums metrics).
	if err := checkRelease("r", fl.Privacy{}, bundle(1, 10, fl.DefaultMetrics)); err != nil {
		t.Fatalf("no DP: %v", err)
	}
}
