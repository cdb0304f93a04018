package fl

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
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
		"evaluation: {holdout: 0.2}\n":           7,
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
