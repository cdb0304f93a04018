package fl

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/model"
)

// Under DP the statistics step's noised sums, the count's included, can
// be anything: a negative or zero count, means beyond the bounds, negative
// variances. StatsFromSums makes every one of them a usable standardiser
// (post-processing), so the step never fails on noise. The draws put the
// count's noise far above the rows; the power check counts how many would
// have been refused before (a count below one).
func TestStatsFromNoisySumsAlwaysUsable(t *testing.T) {
	bounds := []float64{120, 1, 600}
	const rows, trials = 90.0, 2000
	noise := StatsNoise(40, len(bounds), 3, false) // ≈ 390, four times the rows
	rng := rand.New(rand.NewPCG(3, 4))             // test draws of the noise, not DP noise
	var negative int
	for range trials {
		sums := make([]float64, 2*len(bounds))
		for j := range sums {
			sums[j] = noise * rng.NormFloat64()
		}
		n := rows + noise*rng.NormFloat64()
		if n < 1 {
			negative++
		}
		got, err := StatsFromSums(sums, n, &StatsDP{Bounds: Bounds{Half: bounds}, Noise: noise})
		if err != nil {
			t.Fatalf("noisy sums (count %.3g) refused: %v", n, err)
		}
		if !(got.Rows >= 2*noise) {
			t.Fatalf("count %.3g used as %.3g, below twice its noise %.3g", n, got.Rows, noise)
		}
		for j, b := range bounds {
			if m, sd := got.Mean[j], got.Std[j]; !(math.Abs(m) <= b) || !(sd > 0 && sd <= b) {
				t.Fatalf("feature %d (bound %g): mean %v, std %v", j, b, m, sd)
			}
		}
	}
	if negative < trials/10 {
		t.Fatalf("only %d of %d draws had a count below one: the test has no power", negative, trials)
	}
	// Without DP the count is exact: no rows at all is an error.
	if _, err := StatsFromSums([]float64{0, 0}, 0, nil); err == nil || !strings.Contains(err.Error(), "rows") {
		t.Fatalf("no rows without DP: %v", err)
	}
	// A public count is exact too.
	if _, err := StatsFromSums([]float64{0, 0}, 0, &StatsDP{Bounds: Bounds{Half: []float64{1}}, Noise: 5, PublicRows: true}); err == nil {
		t.Fatal("a public count of no rows was accepted")
	}
}

// The released vector: its values are those StatsFromSums decodes, and
// the public count, when there is one, is exact on the grid and unnoised
// while the sums are noised.
func TestReleaseStatsPublicRows(t *testing.T) {
	d := &model.Dataset{Features: []string{"a"}, X: mat.NewDense(3, 1, []float64{1, 2, 3}), Y: []float64{0, 1, 0}}
	p := Privacy{Unit: UnitRecord, Sigma: 50, Clip: 1, SampleRate: 0.1}
	const grid = 10
	seen := map[int64]bool{}
	for range 5 {
		y, mechs, err := p.ReleaseStats(d, Bounds{Half: []float64{4}}, true, grid)
		if err != nil || len(y) != 3 || len(mechs) != 1 {
			t.Fatalf("release %v, %v: %v", y, mechs, err)
		}
		if y[2] != 3<<grid {
			t.Fatalf("public count %d, want %d", y[2], 3<<grid)
		}
		seen[y[0]] = true
	}
	if len(seen) < 2 {
		t.Fatal("five releases of the sums at σ = 50 were all the same: not noised")
	}
	counts := map[int64]bool{}
	for range 5 {
		y, _, err := p.ReleaseStats(d, Bounds{Half: []float64{4}}, false, grid)
		if err != nil || len(y) != 3 {
			t.Fatalf("release with a noised count %v: %v", y, err)
		}
		counts[y[2]] = true
	}
	if len(counts) < 2 {
		t.Fatal("five releases of a noised count at σ = 50 were all the same")
	}
}

// With evaluation.every k the steps are the statistics, blocks of k
// training rounds each followed by an evaluation step, and the final
// evaluation; Step, TrainStep and StepCount agree, and every training
// round appears once, in order.
func TestStepScheduleWithEvaluationEvery(t *testing.T) {
	cases := []struct {
		rounds, every int
		std           string
		want          string
	}{
		{3, 0, "", "S T0 T1 T2 E3"},
		{4, 2, "", "S T0 T1 E2 T2 T3 E4"},
		{5, 2, "local", "T0 T1 E2 T2 T3 E4 T4 E5"},
		{3, 1, "", "S T0 E1 T1 E2 T2 E3"},
		{2, 5, "", "S T0 T1 E2"},
	}
	for _, c := range cases {
		s := &RunSpec{Rounds: c.rounds, Standardize: c.std, Eval: EvalSpec{Holdout: 0.2, Every: c.every}}
		var got []string
		for r := range s.StepCount() {
			kind, n := s.Step(r)
			switch kind {
			case StepStats:
				got = append(got, "S")
			case StepTrain:
				got = append(got, "T"+strconv.Itoa(n))
				if s.TrainStep(n) != r {
					t.Errorf("%+v: training round %d is step %d, TrainStep says %d", c, n, r, s.TrainStep(n))
				}
			case StepEval:
				got = append(got, "E"+strconv.Itoa(n))
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("rounds %d every %d %s: %s, want %s", c.rounds, c.every, c.std, g, c.want)
		}
	}
}

// A range [lo, hi] scales around its centre, and StatsFromSums moves the
// mean back: noiseless sums give the pooled mean and std of the values
// clipped to their ranges.
func TestStatsRoundTripWithRanges(t *testing.T) {
	d := &model.Dataset{Features: []string{"a", "b"}, X: mat.NewDense(4, 2, []float64{101, -1, 102, 0, 130, 1, 99, 2}), Y: []float64{0, 1, 0, 1}}
	b := Bounds{Center: []float64{110, 0}, Half: []float64{10, 3}} // [100, 120], [−3, 3]
	clipped := &model.Dataset{Features: d.Features, X: mat.NewDense(4, 2, []float64{101, -1, 102, 0, 120, 1, 100, 2}), Y: d.Y}
	want := model.FitStandardizer(clipped)
	sums := make([]float64, 5)
	for r := range StatsRecords(d, b, false) {
		for i, v := range r {
			sums[i] += v
		}
	}
	std, err := StatsFromSums(sums[:4], sums[4], &StatsDP{Bounds: b})
	if err != nil {
		t.Fatal(err)
	}
	for j := range 2 {
		if math.Abs(std.Mean[j]-want.Mean[j]) > 1e-9 || math.Abs(std.Std[j]-want.Std[j]) > 1e-9 {
			t.Fatalf("feature %d: %v/%v, pooled %v/%v", j, std.Mean[j], std.Std[j], want.Mean[j], want.Std[j])
		}
	}
}
