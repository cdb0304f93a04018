package dp

import (
	"math"
	"slices"
	"testing"
)

// The released sum of many records is their plain sum plus noise of the
// scale T the mechanism is charged for; each record is clipped on its own,
// never the sum.
func TestReleaseSumOnGridMatchesPlainSum(t *testing.T) {
	const n, dim, clip, sigma, f = 2000, 3, 2.0, 1.0, 10
	rec := []float64{0.5, -1, 1} // norm 1.5 ≤ clip
	var want [dim]float64
	records := func(yield func([]float64) bool) {
		for range n {
			if !yield(rec) {
				return
			}
		}
	}
	for i := range dim {
		want[i] = n * rec[i]
	}
	y, charge, err := ReleaseSumOnGrid(records, dim, clip, sigma, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(charge) != 1 || charge[0] != SubsampledGaussian(sigma, 1, 1) {
		t.Fatalf("charge %v, want one Gaussian step at σ = %v, q = 1", charge, sigma)
	}
	g := GridGaussian{Clip: clip, Sigma: sigma, FracBits: f, Dim: dim}
	tol := 8*float64(g.NoiseScale())/math.Ldexp(1, f) + 1 // 8 noise deviations, and the rounding's drift
	got := FromGrid(y, f)
	for i := range dim {
		if math.Abs(got[i]-want[i]) > tol {
			t.Fatalf("coordinate %d: released %v, plain sum %v (tolerance %v)", i, got[i], want[i], tol)
		}
	}
	// A record beyond the clip is clipped on its own: the sum of one big
	// record is at most clip in norm (plus noise).
	big := []float64{100, 0, 0}
	y, _, err = ReleaseSumOnGrid(slices.Values([][]float64{big}), dim, clip, sigma, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := FromGrid(y, f)[0]; v > clip+tol {
		t.Fatalf("one record of norm 100 released %v; the clip is %v", v, clip)
	}
	if big[0] != 100 {
		t.Fatal("the caller's record was changed")
	}
	if _, _, err := ReleaseSumOnGrid(records, dim, clip, 0, f, nil); err == nil {
		t.Fatal("a release without noise was accepted")
	}
}
