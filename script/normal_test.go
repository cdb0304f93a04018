package script

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestNormalIsNormFloat64 checks that the replayable normal sampler is
// math/rand/v2's NormFloat64 draw for draw on amd64, where the standard one
// has no fused multiply-adds (its tail's assembly Exp and Log may still
// differ by an ulp; over these draws the comparisons they feed do not
// flip), so rng.normals kept its values where it ran before.
func TestNormalIsNormFloat64(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("NormFloat64 fuses multiply-adds on %s; the cross-architecture test is TestReplayableAcrossArchitectures in cmd/scellis", runtime.GOARCH)
	}
	ours := rand.New(rand.NewPCG(7, 11))
	std := rand.New(rand.NewPCG(7, 11))
	for i := range 500000 {
		if a, b := normal(ours), std.NormFloat64(); a != b {
			t.Fatalf("draw %d: normal gave %v, NormFloat64 %v", i, a, b)
		}
	}
}
