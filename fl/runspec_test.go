package fl

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/trust"
)

const goodRun = `name: fedprox-hospitals
strategy: {use: fedprox, params: {mu: 0.1, lr: 0.1, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 20
cohort: {silos: [h1, h2, h3, h4], min: 3}
privacy: {clip: 1.0, sigma: 1.1, q: 0.05, steps: 20, feature_bounds: [120, 1, 80, 300, 600, 500, 1, 40, 20]}
secure_aggregation: true
seed: 7
`

func TestRunSpecParsesAndResolves(t *testing.T) {
	s, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil {
		t.Fatal(err)
	}
	if s.Rounds != 20 || len(s.Silos) != 4 || s.Privacy(UnitRecord).Sigma != 1.1 || !s.SecureAgg {
		t.Fatalf("%+v", s)
	}
	cat, _ := catalog.Builtin()
	_, id1, st, err := s.Resolve(cat, ".")
	if err != nil || st.Entry.Name != "fedprox" {
		t.Fatal(err)
	}
	s.Rounds = 21
	_, id2, _, _ := s.Resolve(cat, ".")
	if id1 == id2 {
		t.Fatal("changing the rounds kept the run ID")
	}
}

func TestRunSpecReportsEveryProblem(t *testing.T) {
	_, err := ParseRunSpec("run.yaml", []byte("name: x\nstrategy: fedavg\nrounds: 0\nprivacy: {sigma: 1}\ncohort: {min: 2}\ncolour: red\n"))
	ds, ok := diag.As(err)
	if !ok || len(ds) < 4 {
		t.Fatalf("want every problem at once, got %v", err)
	}
}

// The statistics step's DP path scales by the bounds (and shifts the
// squares by ½) and StatsFromSums undoes it: on noiseless sums it gives
// the pooled mean and std, with the count noised or public; every row's
// vector stays within the sensitivity the noise is calibrated to.
func TestStatsRoundTripWithBounds(t *testing.T) {
	d := &model.Dataset{Features: []string{"a", "b"}, X: mat.NewDense(4, 2, []float64{1, 10, 2, 20, 3, 30, -9, 60}), Y: []float64{0, 1, 0, 1}}
	bounds := []float64{8, 50}
	clipped := &model.Dataset{Features: d.Features, X: mat.NewDense(4, 2, []float64{1, 10, 2, 20, 3, 30, -8, 50}), Y: d.Y}
	want := model.FitStandardizer(clipped)
	for _, public := range []bool{false, true} {
		sums := make([]float64, 5)
		for r := range StatsRecords(d, Bounds{Half: bounds}, public) {
			if len(r) != StatsDim(2, public) {
				t.Fatalf("a record of %d values, want %d", len(r), StatsDim(2, public))
			}
			var norm float64
			for i, v := range r {
				sums[i] += v
				norm += v * v
			}
			if math.Sqrt(norm) > StatsSensitivity(2, public)+1e-12 {
				t.Fatalf("a record of norm %v above the sensitivity %v", math.Sqrt(norm), StatsSensitivity(2, public))
			}
		}
		if public {
			sums[4] = float64(d.Rows())
		}
		std, err := StatsFromSums(sums[:4], sums[4], &StatsDP{Bounds: Bounds{Half: bounds}, PublicRows: public})
		if err != nil {
			t.Fatal(err)
		}
		for j := range 2 {
			if math.Abs(std.Mean[j]-want.Mean[j]) > 1e-12 || math.Abs(std.Std[j]-want.Std[j]) > 1e-12 {
				t.Fatalf("public %v, feature %d: %v/%v, pooled %v/%v", public, j, std.Mean[j], std.Std[j], want.Mean[j], want.Std[j])
			}
		}
	}
	// Each feature adds at most u² + (u² − ½)² ≤ 5/4, the count 1.
	if got := StatsSensitivity(2, false); got != math.Sqrt(3.5) {
		t.Fatalf("sensitivity %v", got)
	}
	if got := StatsSensitivity(2, true); got != math.Sqrt(2.5) {
		t.Fatalf("sensitivity with a public count %v", got)
	}
}

// A run classes its model and strategy; the classes reach admission, enter
// the run ID, and an unknown class is SC4005 at its line.
func TestRunSpecClasses(t *testing.T) {
	src := strings.Replace(goodRun, "model: {kind: logistic, inputs: 9}", "model: {kind: logistic, inputs: 9, class: confidential}", 1)
	src = strings.Replace(src, "strategy: {use: fedprox,", "strategy: {class: public, use: fedprox,", 1)
	s, err := ParseRunSpec("run.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	items := s.Classed()
	if len(items) != 2 || items[0].Class != trust.Confidential || items[1].Class != trust.Public {
		t.Fatalf("classed: %+v", items)
	}
	plain, _ := ParseRunSpec("run.yaml", []byte(goodRun))
	cat, _ := catalog.Builtin()
	_, id1, _, _ := plain.Resolve(cat, ".")
	_, id2, _, _ := s.Resolve(cat, ".")
	if id1 == id2 {
		t.Fatal("classing the model kept the run ID")
	}
	_, err = ParseRunSpec("run.yaml", []byte(strings.Replace(goodRun, "inputs: 9}", "inputs: 9, class: secret}", 1)))
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.UnknownInputClass || ds[0].Pos == nil || ds[0].Pos.Line != 3 {
		t.Fatalf("a bad model class: %v", err)
	}
}

// A training round samples the cohort without going below the secure
// aggregation minimum, picks the same silos when re-planned, and gives
// the stragglers' share of them partial work; other steps take everyone.
func TestRoundCohort(t *testing.T) {
	members := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	s := &RunSpec{Sample: 0.1, Stragglers: 0.9, MinCohort: 3}
	c1, w1 := s.RoundCohort("sha256:run", 4, StepTrain, members)
	c2, w2 := s.RoundCohort("sha256:run", 4, StepTrain, members)
	if len(c1) != 3 || !slices.Equal(c1, c2) || len(w1) != 3 || !maps.Equal(w1, w2) {
		t.Fatalf("cohort %v work %v; again %v %v", c1, w1, c2, w2)
	}
	for name, w := range w1 {
		if !slices.Contains(c1, name) || !(w > 0 && w < 1) {
			t.Fatalf("straggler %s work %v outside the cohort %v or (0, 1)", name, w, c1)
		}
	}
	s.Sample = 0.5
	if c, w := s.RoundCohort("sha256:run", 5, StepTrain, members); len(c) != 5 || len(w) != 5 { // round(0.9·5)
		t.Fatalf("half of ten: %v, %d stragglers", c, len(w))
	}
	if c, w := s.RoundCohort("sha256:run", 0, StepStats, members); len(c) != 10 || w != nil {
		t.Fatalf("the statistics step sampled %v (work %v)", c, w)
	}
	// Under DP a straggler a strategy drops takes no part: the draw
	// leaves max(3, cohort.min) sites their whole work.
	s.DP = true
	if c, w := s.RoundCohort("sha256:run", 5, StepTrain, members); len(c) != 5 || len(w) != 2 {
		t.Fatalf("half of ten under DP: %v, %d stragglers, want 2", c, len(w))
	}
	s.DP = false
	// Groups (a tree's children) are sampled apart, each keeping the
	// minimum; one group draws as the whole.
	groups := [][]string{{}, {"a", "b", "c", "d"}, {"e", "f", "g", "h", "i", "j"}}
	c, _ := s.RoundCohortOf("sha256:run", 5, StepTrain, groups)
	var inA, inB int
	for _, name := range c {
		if name <= "d" {
			inA++
		} else {
			inB++
		}
	}
	if inA != 3 || inB != 3 {
		t.Fatalf("grouped draw %v: %d of the first child, %d of the second; want 3 and round(0.5·6) = 3", c, inA, inB)
	}
	c1, w1 = s.RoundCohortOf("sha256:run", 5, StepTrain, [][]string{members})
	if one, w := s.RoundCohort("sha256:run", 5, StepTrain, members); !slices.Equal(c1, one) || !maps.Equal(w1, w) {
		t.Fatalf("one group %v %v, RoundCohort %v %v", c1, w1, one, w)
	}
	// A buffered run fills each server step's buffer with K silos.
	b := &RunSpec{Buffer: 4, MinCohort: 3}
	if c, w := b.RoundCohort("sha256:run", 2, StepTrain, members); len(c) != 4 || w != nil {
		t.Fatalf("buffer of 4: %v (work %v)", c, w)
	}
	for _, src := range []string{"cohort: {buffer: 2}", "cohort: {buffer: 3}"} {
		_, err := ParseRunSpec("run.yaml", []byte("name: b\nstrategy: fedbuff\nmodel: {kind: logistic, inputs: 2}\ndataset: d\nrounds: 1\nprivacy: {dp: false}\n"+src+"\n"))
		if (err == nil) != strings.HasSuffix(src, "3}") {
			t.Errorf("%s: %v", src, err)
		}
	}
}

// Under DP the released second moment of a feature whose spread is small
// against its public bound is mostly noise; StatsFromSums must never turn
// that noise into a deviation far below the truth (which would blow the
// feature up by a random factor each run). Without the noise-aware floor
// the same draws do (the test's power check).
func TestStatsFromNoisySumsNeverUnderestimateSpread(t *testing.T) {
	const (
		rows   = 3200.0
		bound  = 600.0
		mean   = 100.0
		sd     = 25.0
		sigma  = 6.0
		sites  = 4
		trials = 300
	)
	noise := StatsNoise(sigma, 1, sites, false)
	rng := rand.New(rand.NewPCG(1, 2)) // test draws of the noise, not DP noise
	exact := []float64{rows * mean / bound, rows * ((sd*sd+mean*mean)/(bound*bound) - 0.5)}
	var below int
	for range trials {
		sums := []float64{exact[0] + noise*rng.NormFloat64(), exact[1] + noise*rng.NormFloat64()}
		n := rows + noise*rng.NormFloat64()
		got, err := StatsFromSums(sums, n, &StatsDP{Bounds: Bounds{Half: []float64{bound}}, Noise: noise})
		if err != nil {
			t.Fatal(err)
		}
		if got.Std[0] < sd/2 || got.Std[0] > bound {
			t.Fatalf("std %.3g from noisy sums; the feature's is %.3g and its bound %.3g", got.Std[0], sd, bound)
		}
		naive, _ := StatsFromSums(sums, n, &StatsDP{Bounds: Bounds{Half: []float64{bound}}})
		if naive.Std[0] < sd/2 {
			below++
		}
	}
	if below == 0 {
		t.Fatalf("without the floor no draw underestimated the spread: the test has no power")
	}
}

// aggregation: masking is the default and hashes as an unset field;
// threshold-he is kept; anything else, or threshold-he without secure
// aggregation, is refused with the line it is on.
func TestRunSpecAggregation(t *testing.T) {
	cat, _ := catalog.Builtin()
	base, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil {
		t.Fatal(err)
	}
	_, idDefault, _, _ := base.Resolve(cat, ".")
	masking, err := ParseRunSpec("run.yaml", []byte(goodRun+"aggregation: masking\n"))
	if err != nil || masking.AggregationMode() != AggMasking || masking.Aggregation != "" {
		t.Fatalf("masking: %v %+v", err, masking)
	}
	if _, id, _, _ := masking.Resolve(cat, "."); id != idDefault {
		t.Fatal("naming the default mode changed the run ID")
	}
	he, err := ParseRunSpec("run.yaml", []byte(goodRun+"aggregation: threshold-he\n"))
	if err != nil || he.AggregationMode() != AggThresholdHE {
		t.Fatalf("threshold-he: %v", err)
	}
	if _, id, _, _ := he.Resolve(cat, "."); id == idDefault {
		t.Fatal("threshold-he kept the masking run's ID")
	}
	for _, bad := range []string{"aggregation: homomorphic\n", "aggregation: threshold-he\n"} {
		src := goodRun + bad
		if strings.HasSuffix(bad, "threshold-he\n") {
			src = strings.Replace(src, "secure_aggregation: true", "secure_aggregation: false", 1)
		}
		_, err := ParseRunSpec("run.yaml", []byte(src))
		ds, ok := diag.As(err)
		if !ok || ds[0].Code != diag.InvalidValue || !strings.Contains(err.Error(), "run.yaml:10:") {
			t.Fatalf("%q: want SC1005 at run.yaml:10, got %v", bad, err)
		}
	}
}

// masking: pairwise|secagg+ is kept (and changes the run ID); it needs
// masked secure aggregation, and an unknown protocol is refused with the
// line it is on.
func TestRunSpecMasking(t *testing.T) {
	cat, _ := catalog.Builtin()
	base, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil {
		t.Fatal(err)
	}
	_, idDefault, _, _ := base.Resolve(cat, ".")
	for _, p := range []string{"pairwise", "secagg+"} {
		s, err := ParseRunSpec("run.yaml", []byte(goodRun+"masking: "+p+"\n"))
		if err != nil || s.Masking != p {
			t.Fatalf("masking: %s: %v %+v", p, err, s)
		}
		if _, id, _, _ := s.Resolve(cat, "."); id == idDefault {
			t.Fatalf("masking: %s kept the default run's ID", p)
		}
	}
	for _, bad := range []string{"masking: secagg++\n", "aggregation: threshold-he\nmasking: secagg+\n"} {
		_, err := ParseRunSpec("run.yaml", []byte(goodRun+bad))
		ds, ok := diag.As(err)
		if !ok || ds[0].Code != diag.InvalidValue || !strings.Contains(err.Error(), "masking") {
			t.Fatalf("%q: want SC1005 on masking, got %v", bad, err)
		}
	}
	src := strings.Replace(goodRun, "secure_aggregation: true", "secure_aggregation: false", 1) + "masking: pairwise\n"
	if _, err := ParseRunSpec("run.yaml", []byte(src)); err == nil {
		t.Fatal("masking without secure aggregation accepted")
	}
}

// privacy.feature_bounds takes a bound B ([−B, B]) or a range [lo, hi]
// per feature; symmetric bounds hash as before (no centres stored).
// evaluation.every needs rows to evaluate on, public_rows a statistics
// step; eval_sigma prices the evaluation steps alone.
func TestRunSpecBoundsEveryPublicRows(t *testing.T) {
	const src = `name: r
strategy: fedavg
model: {kind: logistic, inputs: 3}
dataset: d
rounds: 4
privacy: {clip: 1, sigma: 1, q: 0.1, steps: 5, sums_sigma: 6, eval_sigma: 9, public_rows: true, feature_bounds: [10, [0, 120], [-3, 5]]}
evaluation: {holdout: 0.2, every: 2}
`
	s, err := ParseRunSpec("run.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.FeatureBounds, []float64{10, 60, 4}) || !slices.Equal(s.FeatureCenters, []float64{0, 60, 1}) {
		t.Fatalf("bounds %v centres %v", s.FeatureBounds, s.FeatureCenters)
	}
	if !s.PublicRows || s.Eval.Every != 2 || s.StepCount() != 1+4+1+1 {
		t.Fatalf("%+v: %d steps", s, s.StepCount())
	}
	if s.StepSigma(StepStats) != 6 || s.StepSigma(StepEval) != 9 || s.StepSigma(StepTrain) != 1 {
		t.Fatalf("step σ: stats %v eval %v train %v", s.StepSigma(StepStats), s.StepSigma(StepEval), s.StepSigma(StepTrain))
	}
	sym, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil || sym.FeatureCenters != nil {
		t.Fatalf("symmetric bounds kept centres %v (%v)", sym.FeatureCenters, err)
	}
	for _, bad := range []struct{ from, to, code, line string }{
		{"[-3, 5]]", "[5, -3]]", "SC1005", ":6:"},
		{"[-3, 5]]", "[1, 2, 3]]", "SC1005", ":6:"},
		{"{holdout: 0.2, every: 2}", "{every: 2}", "SC1004", ":7:"},
		{"evaluation: {holdout: 0.2, every: 2}", "standardize: local", "SC1005", ":6:"},
	} {
		_, err := ParseRunSpec("run.yaml", []byte(strings.Replace(src, bad.from, bad.to, 1)))
		if err == nil || !strings.Contains(err.Error(), bad.code) || !strings.Contains(err.Error(), bad.line) {
			t.Errorf("%s → %s: %v", bad.from, bad.to, err)
		}
	}
}
