package trainer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/trainer"
)

// BenchmarkTrainerRound measures what one silo's trainer round costs beyond
// the trainer's own training: the whole sandboxed run (namespaces, bind
// mounts, interpreter start, imports, reading the data, writing and
// checking the weights) against the seconds train() itself took (which the
// helper reports), and against the same trainer run without the sandbox
// (the interpreter started directly on the same files), in the same run.
// It reports overhead-x (sandboxed wall time / train() time) and sandbox-x
// (sandboxed / unsandboxed wall time). The CNN of examples/trainer-cnn on
// 300 glyph images, 3 epochs; under -short, the numpy fixture (no torch).
func BenchmarkTrainerRound(b *testing.B) {
	dirName, data, params := "../examples/trainer-cnn", "", map[string]any{"lr": 0.03, "momentum": 0.9, "epochs": 3, "batch_size": 16}
	check := "import torch, numpy"
	if testing.Short() {
		dirName, params, check = "testdata/numpy", map[string]any{"lr": 0.1, "epochs": 3}, "import numpy"
	}
	if err := exec.Command(python, "-c", check).Run(); err != nil {
		b.Skipf("%s cannot %s", python, check)
	}
	work := b.TempDir()
	if testing.Short() {
		data = writeRows(b, work)
	} else {
		sites, _, err := datagen.Glyphs(1, 300, 0, 0.5, 1)
		if err != nil {
			b.Fatal(err)
		}
		paths, err := datagen.WriteSites(work, sites)
		if err != nil {
			b.Fatal(err)
		}
		data = paths[0]
	}
	bundle, err := trainer.Load(dirName)
	if err != nil {
		b.Fatal(err)
	}
	lim := trainer.Limits{CPUSeconds: 600, MemoryMB: 4096, Wall: 10 * time.Minute}
	ctx := context.Background()
	init, err := trainer.Run(ctx, trainer.Job{Interpreter: python, Bundle: bundle, Mode: trainer.ModeInit, Dir: work, Limits: lim})
	if err != nil {
		b.Fatal(err)
	}
	job := trainer.Job{Interpreter: python, Bundle: bundle, Mode: trainer.ModeTrain, Data: data, Label: "label",
		Weights: init.Weights, Layout: init.Layout, Params: params, Dir: work, Limits: lim}
	// The unsandboxed baseline: the same inputs laid out by hand.
	plain := filepath.Join(work, "plain")
	for _, d := range []string{"trainer", "lib", "io/in", "io/out"} {
		os.MkdirAll(filepath.Join(plain, d), 0o755)
	}
	bundle.Unpack(filepath.Join(plain, "trainer"))
	os.WriteFile(filepath.Join(plain, "lib", trainer.HelperModule), trainer.Helper, 0o644)
	if _, err := trainer.Run(ctx, job); err != nil { // warms the page cache for both
		b.Fatal(err)
	}
	var sandboxed, unsandboxed time.Duration
	var trained float64
	b.ResetTimer()
	for range b.N {
		began := time.Now()
		r, err := trainer.Run(ctx, job)
		if err != nil {
			b.Fatal(err)
		}
		sandboxed += time.Since(began)
		trained += r.Metrics["train_seconds"]

		began = time.Now()
		if err := runPlain(plain, job); err != nil {
			b.Fatal(err)
		}
		unsandboxed += time.Since(began)
	}
	b.ReportMetric(sandboxed.Seconds()/trained, "overhead-x")
	b.ReportMetric(sandboxed.Seconds()/unsandboxed.Seconds(), "sandbox-x")
	b.ReportMetric(trained/float64(b.N), "train-s/op")
}

// runPlain runs the trainer's train mode directly, without the sandbox,
// on the inputs the sandboxed run would see (the data file by its own
// path).
func runPlain(dir string, j trainer.Job) error {
	spec, err := json.Marshal(map[string]any{"format": trainer.Format, "mode": j.Mode, "data": j.Data, "label": j.Label, "layout": j.Layout, "params": j.Params})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "io", "in", "params.json"), spec, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "io", "in", "weights.npy"), trainer.EncodeNPY(j.Weights), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(j.Interpreter, "-B", "-s", filepath.Join(dir, "trainer", j.Bundle.Entry), j.Mode)
	cmd.Env = []string{"PYTHONPATH=" + filepath.Join(dir, "lib"), "SCELLIS_IO=" + filepath.Join(dir, "io"), "OMP_NUM_THREADS=1", "HOME=" + dir}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}
