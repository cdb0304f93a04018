package fl

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/trainer"
)

const trainerRun = `name: cnn
strategy: {use: fedprox, params: {mu: 0.01, lr: 0.03, epochs: 2}}
trainer: cnn
dataset: glyphs
rounds: 3
privacy: {clip: 4.0, sigma: 0.5}
`

// writeTrainer writes a trainer directory with a two-tensor initial model.
func writeTrainer(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"train.py":    []byte("import scellis_trainer\n"),
		"init.npy":    trainer.EncodeNPY([]float64{0.5, -0.5, 0.25, 0}),
		"layout.json": []byte(`[{"name": "w", "shape": [3]}, {"name": "b", "shape": [1]}]`),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A run with a trainer resolves to the trainer's content hash (the
// directory's base name in the spec, so the run's ID does not depend on
// where the run file lies), has no statistics step, and starts from the
// trainer's init.npy.
func TestTrainerRunResolves(t *testing.T) {
	dir := t.TempDir()
	writeTrainer(t, filepath.Join(dir, "cnn"))
	s, err := ParseRunSpec("run.yaml", []byte(trainerRun))
	if err != nil {
		t.Fatal(err)
	}
	if s.StandardizeMode() != StandardizeNone || s.StepCount() != 3 {
		t.Fatalf("a trainer run standardises %s and has %d steps", s.StandardizeMode(), s.StepCount())
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	canon, id, _, err := s.Resolve(cat, dir)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := canon.TrainerBundle.Ref()
	if canon.Trainer != ref || canon.Spec.Trainer != "cnn" {
		t.Fatalf("canonical trainer %s (%q), bundle %s", canon.Trainer, canon.Spec.Trainer, ref)
	}
	if canon.TrainerParams != 4 || canon.NumParams() != 4 {
		t.Fatalf("a trainer run of 4 weights: trainer_params %d, NumParams %d", canon.TrainerParams, canon.NumParams())
	}
	g, err := TrainerGlobal(canon.TrainerBundle)
	if w, _ := g.Vector("w"); err != nil || !slices.Equal(w, []float64{0.5, -0.5, 0.25, 0}) {
		t.Fatalf("initial global %v %v", g, err)
	}
	// The same trainer elsewhere: the same run. Another file: another run.
	other := t.TempDir()
	writeTrainer(t, filepath.Join(other, "cnn"))
	if _, id2, _, err := s.Resolve(cat, other); err != nil || id2 != id {
		t.Fatalf("the same trainer in another folder gives run %s, not %s (%v)", id2, id, err)
	}
	os.WriteFile(filepath.Join(other, "cnn", "train.py"), []byte("import scellis_trainer  # changed\n"), 0o644)
	if _, id3, _, err := s.Resolve(cat, other); err != nil || id3 == id {
		t.Fatalf("a changed trainer gives the same run %s (%v)", id3, err)
	}
	// Without initial weights the run is refused at launch.
	os.Remove(filepath.Join(other, "cnn", "init.npy"))
	if _, _, _, err := s.Resolve(cat, other); !hasCode(err, diag.TrainerBad) {
		t.Fatalf("a trainer without init.npy: %v", err)
	}
}

// What a trainer run cannot have is refused at its line.
func TestTrainerRunRefuses(t *testing.T) {
	for extra, at := range map[string]int{
		"standardize: local\n":                   7,
		"privacy: {clip: 1, sigma: 1, q: 0.1}\n": 7,
	} {
		src := trainerRun
		if extra[:7] == "privacy" {
			src = src[:len(src)-len("privacy: {clip: 4.0, sigma: 0.5}\n")]
			at = 6
		}
		_, err := ParseRunSpec("run.yaml", []byte(src+extra))
		ds, _ := diag.As(err)
		if len(ds) != 1 || ds[0].Code != diag.InvalidValue || ds[0].Pos == nil || ds[0].Pos.Line != at {
			t.Fatalf("%q: %v", extra, err)
		}
	}
}

// A trainer's update is released as a built-in model's: without DP scaled
// by its examples with that weight; at the silo level clipped to the clip,
// on the grid and noised, with weight 1 and one charge; at the record
// level refused.
func TestTrainerOutput(t *testing.T) {
	global := []float64{1, 2, 3}
	trained := []float64{1.5, 2, 2}
	out, err := TrainerOutput(global, trained, 10, Privacy{})
	if err != nil || out.Weight != 10 || !slices.Equal(out.Update, []float64{5, 0, -10}) || out.Encoded != nil {
		t.Fatalf("without DP: %+v %v", out, err)
	}
	far := []float64{101, 2, 3} // an update of norm 100
	p := Privacy{Unit: UnitSilo, Clip: 1, Sigma: 1e-3}
	out, err = TrainerOutput(global, far, 300, p)
	if err != nil || out.Weight != 1 || out.Encoded == nil || len(out.Mechanism.Mechanisms) != 1 {
		t.Fatalf("silo level: %+v %v", out, err)
	}
	if n := math.Hypot(math.Hypot(out.Update[0], out.Update[1]), out.Update[2]); math.Abs(n-1) > 0.05 {
		t.Fatalf("the released update has norm %v; clipped to 1 and barely noised it should be about 1", n)
	}
	if _, err := TrainerOutput(global, far, 300, Privacy{Unit: UnitRecord, SampleRate: 0.1, Clip: 1, Sigma: 1}); !hasCode(err, diag.TrainerUnit) {
		t.Fatalf("record level: %v", err)
	}
	if _, err := TrainerOutput(global, trained[:2], 3, p); !hasCode(err, diag.TrainerOutput) {
		t.Fatalf("wrong length: %v", err)
	}
	if _, err := TrainerOutput(global, trained, 0, p); !hasCode(err, diag.TrainerOutput) {
		t.Fatalf("no examples: %v", err)
	}
}

// A trainer run evaluates as a built-in model's does (evaluation.holdout
// or .dataset, every k rounds): evaluation steps after the training, whose
// sums are the held-out metrics; its training rounds do not sum them too
// (the trainer would run twice a round), with or without DP.
func TestTrainerRunEvaluates(t *testing.T) {
	dir := t.TempDir()
	writeTrainer(t, filepath.Join(dir, "cnn"))
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{trainerRun, strings.Replace(trainerRun, "privacy: {clip: 4.0, sigma: 0.5}\n", "privacy: {dp: false}\n", 1)} {
		s, err := ParseRunSpec("run.yaml", []byte(src+"evaluation: {holdout: 0.25, every: 2}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if s.StepCount() != 5 {
			t.Fatalf("3 rounds evaluated every 2 and at the end: %d steps", s.StepCount())
		}
		canon, _, st, err := s.Resolve(cat, dir)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := TrainerGlobal(canon.TrainerBundle)
		env := script.Env{Catalog: cat}
		for r := range s.StepCount() {
			step, _ := s.Step(r)
			dims, names, _, err := s.StepSums(context.Background(), env, st, g, step)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case step == StepEval && (dims != 0 || !slices.Equal(names, EvalMetrics)):
				t.Fatalf("DP %v, step %d (%s) sums %d values and %v", s.DP, r, step, dims, names)
			case step == StepTrain && (dims != 4 || slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "eval_") })):
				t.Fatalf("DP %v, training step %d sums %d values and %v", s.DP, r, dims, names)
			}
		}
	}
}

// A trainer's evaluate sums are released exactly without DP; under DP
// the silo is the unit: its accuracy, 1 and its mean loss (capped) as one
// record, noised on the grid and charged one Gaussian step, whatever the
// trainer reported. A report no evaluate could make is SC9507.
func TestTrainerEvalRelease(t *testing.T) {
	m := map[string]float64{"examples": 200, "correct": 150, "loss": 100}
	vals, enc, mechs, err := TrainerEvalRelease(m, 200, Privacy{}, 0)
	if err != nil || !slices.Equal(vals, []float64{150, 200, 100}) || enc != nil || mechs != nil {
		t.Fatalf("without DP: %v %v %v %v", vals, enc, mechs, err)
	}
	p := Privacy{Unit: UnitSilo, Clip: 1, Sigma: 1e-4}
	grid := 20
	vals, enc, mechs, err = TrainerEvalRelease(m, 200, p, grid)
	if err != nil || vals != nil || len(enc) != len(EvalMetrics) || len(mechs) != 1 || mechs[0].Q != 1 || mechs[0].Sigma != 1e-4 {
		t.Fatalf("under DP: %v %v %+v %v", vals, enc, mechs, err)
	}
	got := make([]float64, len(enc))
	for i, v := range enc {
		got[i] = math.Ldexp(float64(v), -grid)
	}
	// accuracy 0.75, one silo, mean loss 0.5 (noise σ·√11 ≈ 3e-4)
	for i, want := range []float64{0.75, 1, 0.5} {
		if math.Abs(got[i]-want) > 0.01 {
			t.Fatalf("under DP the silo released %v, want about (0.75, 1, 0.5)", got)
		}
	}
	// A huge loss moves the release no more than the cap.
	_, enc, _, err = TrainerEvalRelease(map[string]float64{"examples": 10, "correct": 0, "loss": 1e9}, 10, p, grid)
	if err != nil || math.Abs(math.Ldexp(float64(enc[2]), -grid)-EvalLossCap) > 0.01 {
		t.Fatalf("a capped loss released as %v (%v)", enc, err)
	}
	for _, bad := range []map[string]float64{
		{"examples": 10, "correct": 11},
		{"examples": -1},
		{"examples": 10, "correct": 2.5},
		{"examples": 10, "loss": -1},
	} {
		if _, _, _, err := TrainerEvalRelease(bad, 10, p, grid); !hasCode(err, diag.TrainerOutput) {
			t.Fatalf("%v: %v", bad, err)
		}
	}
	if _, _, _, err := TrainerEvalRelease(map[string]float64{"examples": 0}, 0, p, grid); !hasCode(err, diag.TrainerOutput) {
		t.Fatalf("no rows under DP: %v", err)
	}
}
