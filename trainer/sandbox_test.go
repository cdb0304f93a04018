package trainer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trainer"
)

const python = "/usr/bin/python3"

// needNumpy skips a test when Debian's python3 cannot import numpy.
func needNumpy(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import numpy").Run(); err != nil {
		t.Skipf("%s cannot import numpy (install python3-numpy): %v", python, err)
	}
}

// fixture loads the numpy trainer of testdata and a CSV of rows with a
// learnable label; it returns the bundle, the data file and the initial
// weights the trainer's init gives.
func fixture(t *testing.T) (*trainer.Bundle, string, []float64, trainer.Layout) {
	t.Helper()
	needNumpy(t)
	b, err := trainer.Load("testdata/numpy")
	if err != nil {
		t.Fatal(err)
	}
	data := writeRows(t, t.TempDir())
	res, err := trainer.Run(context.Background(), trainer.Job{Interpreter: python, Bundle: b, Mode: trainer.ModeInit, Dir: t.TempDir(), Limits: testLimits})
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	return b, data, res.Weights, res.Layout
}

// writeRows writes 300 rows of 4 features and a label 0–2 the features
// predict into dir/rows.csv, readable by its owner only (as datagen
// writes files), and returns its path.
func writeRows(t testing.TB, dir string) string {
	t.Helper()
	data := filepath.Join(dir, "rows.csv")
	var sb strings.Builder
	sb.WriteString("a,b,c,d,label\n")
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		y := r.IntN(3)
		fmt.Fprintf(&sb, "%.3f,%.3f,%.3f,%.3f,%d\n", float64(y)+r.NormFloat64()*0.3, r.NormFloat64(), -float64(y)+r.NormFloat64()*0.3, 1.0, y)
	}
	if err := os.WriteFile(data, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

var testLimits = trainer.Limits{CPUSeconds: 120, MemoryMB: 2048, Wall: 3 * time.Minute}

func job(b *trainer.Bundle, data string, w []float64, l trainer.Layout, params map[string]any, dir string) trainer.Job {
	return trainer.Job{Interpreter: python, Bundle: b, Mode: trainer.ModeTrain, Data: data, Label: "label",
		Weights: w, Layout: l, Params: params, Dir: dir, Limits: testLimits}
}

// TestTrainAndEvaluate runs the numpy trainer's train and evaluate in the
// sandbox: the weights move, and the trained model scores better than the
// initial one on the same rows.
func TestTrainAndEvaluate(t *testing.T) {
	b, data, w0, layout := fixture(t)
	if layout.Size() != 15 || len(w0) != 15 {
		t.Fatalf("init gave layout %v and %d weights", layout, len(w0))
	}
	ctx := context.Background()
	res, err := trainer.Run(ctx, job(b, data, w0, layout, map[string]any{"lr": 0.2, "epochs": 5}, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if res.Examples != 300 || len(res.Weights) != 15 {
		t.Fatalf("train: %d examples, %d weights", res.Examples, len(res.Weights))
	}
	acc := func(w []float64) float64 {
		j := job(b, data, w, layout, nil, t.TempDir())
		j.Mode = trainer.ModeEvaluate
		r, err := trainer.Run(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		return r.Metrics["correct"] / r.Metrics["examples"]
	}
	before, after := acc(w0), acc(res.Weights)
	if !(after > before+0.2 && after > 0.8) {
		t.Fatalf("accuracy %.3f before training, %.3f after", before, after)
	}
}

// TestFailuresAreCoded: every way a trainer can fail comes back as its
// own diagnostic code, never as a crash of the caller or a silent result.
func TestFailuresAreCoded(t *testing.T) {
	b, data, w0, layout := fixture(t)
	for _, c := range []struct {
		misbehave string
		lim       trainer.Limits
		want      diag.Code
	}{
		{"crash", testLimits, diag.TrainerCrashed},
		{"hang", trainer.Limits{CPUSeconds: 120, MemoryMB: 2048, Wall: 5 * time.Second}, diag.TrainerTimeout},
		{"spin", trainer.Limits{CPUSeconds: 2, MemoryMB: 2048, Wall: 3 * time.Minute}, diag.TrainerCPU},
		{"memory", trainer.Limits{CPUSeconds: 120, MemoryMB: 1024, Wall: 3 * time.Minute}, diag.TrainerMemory},
		{"garbage", testLimits, diag.TrainerOutput},
		{"nan", testLimits, diag.TrainerNonFinite},
		{"shape", testLimits, diag.TrainerOutput},
	} {
		t.Run(c.misbehave, func(t *testing.T) {
			t.Parallel() // each its own sandbox and folder; most of the time is waiting (the hang's wall clock)
			j := job(b, data, w0, layout, map[string]any{"misbehave": c.misbehave}, t.TempDir())
			j.Limits = c.lim
			_, err := trainer.Run(context.Background(), j)
			ds, ok := diag.As(err)
			if !ok || ds[0].Code != c.want {
				t.Fatalf("want %s, got %v", c.want, err)
			}
		})
	}
}

// TestSandboxHoldsTheTrainerIn: from inside the sandbox a trainer cannot
// connect to a server listening on the host's loopback, nor read a file
// of the host outside its dataset (a file beside the dataset, the test's
// own source, /etc/hostname), and holds no capability, while its scratch
// folder is writable.
func TestSandboxHoldsTheTrainerIn(t *testing.T) {
	b, data, w0, layout := fixture(t)
	port := acceptingPort(t)
	secret := filepath.Join(filepath.Dir(data), "beside-the-data.csv")
	if err := os.WriteFile(secret, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, _ := filepath.Abs("sandbox_test.go")
	forbidden := []any{secret, src, "/etc/hostname"}
	// The probe itself must work outside the sandbox: each is readable
	// and the port accepts connections here.
	for _, p := range forbidden {
		if _, err := os.ReadFile(p.(string)); err != nil {
			t.Fatalf("the probe's file %s is not readable outside the sandbox: %v", p, err)
		}
	}
	j := job(b, data, w0, layout, map[string]any{"misbehave": "escape", "port": port, "forbidden": forbidden}, t.TempDir())
	j.Mode = trainer.ModeEvaluate
	res, err := trainer.Run(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"socket": 0, "file0": 0, "file1": 0, "file2": 0, "scratch": 1, "capabilities": 0, "bounding": 0, "no_new_privs": 1}
	for k, v := range want {
		if got, ok := res.Metrics[k]; !ok || got != v {
			t.Errorf("%s: got %v (present %v), want %v", k, got, ok, v)
		}
	}
}

// acceptingPort listens on the host's loopback until the test ends and
// returns the port; it checks that a connection from here succeeds, so a
// trainer's failure to connect is the sandbox's doing.
func acceptingPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
