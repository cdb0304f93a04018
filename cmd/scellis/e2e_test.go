package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The tests in this file drive the real binary the way a user does.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// testVersion is stamped into the test binary the way a release build
// stamps its version (-ldflags "-X main.version=…"), so TestVersionStamped
// checks the README's release build without linking a second binary.
const testVersion = "v9.8.7-test"

// scellisBinary builds cmd/scellis once per test process.
func scellisBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "scellis-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "scellis")
		// The test build also honours SCELLIS_TEST_FAULT (package
		// testfault); a release build, without this flag, ignores it.
		ldflags := "-X main.version=" + testVersion + " -X github.com/scellis/scellis/internal/testfault.enabled=yes"
		// Built as a release is (CGO_ENABLED=0, -trimpath: deploy/release),
		// so the release step of CI finds every package compiled and only
		// links; the test's -race covers the test process, not this child.
		build := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", binPath, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		if err != nil {
			buildErr = err
			binPath = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("building scellis: %v\n%s", buildErr, binPath)
	}
	return binPath
}

// scellisCmd runs the binary in dir with an isolated SCELLIS_HOME.
func scellisCmd(t testing.TB, dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(scellisBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
	return cmd
}

func mustRun(t testing.TB, cmd *exec.Cmd) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\nstdout:\n%s\nstderr:\n%s", cmd.Args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// writeSweepFixture generates hospital data and a small 2-parameter sweep.
func writeSweepFixture(t *testing.T) string {
	dir := t.TempDir()
	mustRun(t, scellisCmd(t, dir, "datagen", "hospitals", "--sites", "2", "--rows", "400", "--out", "data"))
	job := `name: sweep
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.03, 0.3], l2: [0.0, 0.01]}
reducer: {use: collect, params: {metric: auc, goal: max}}
params: {model: logistic, epochs: 2, batch_size: 32, test_frac: 0.25, seed: 3}
inputs:
  data: {path: data/hospital-1.csv, label: outcome}
`
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Law 9: the replayable tier is byte-exact across runs.
func TestRunTwiceByteIdentical(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	dir := writeSweepFixture(t)
	mustRun(t, scellisCmd(t, dir, "run", "job.yaml", "--out", "a"))
	mustRun(t, scellisCmd(t, dir, "run", "job.yaml", "--out", "b", "--workers", "1", "--verify"))
	a, _ := os.ReadFile(filepath.Join(dir, "a", "result.json"))
	b, _ := os.ReadFile(filepath.Join(dir, "b", "result.json"))
	// The verification method differs by design; everything else must not.
	a = bytes.Replace(a, []byte("single execution (pool of one)"), []byte("X"), 1)
	b = bytes.Replace(b, []byte("double execution, byte-identical"), []byte("X"), 1)
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatalf("result.json differs between runs:\n%s\n---\n%s", a, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "heatmap.png")); err != nil {
		t.Fatalf("2-parameter sweep wrote no heatmap: %v", err)
	}
}

// Law 4: a pool of one needs no network at all.
func TestRunWithoutNetwork(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed")
	}
	if out, err := exec.Command("unshare", "-n", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace here: %v %s", err, out)
	}
	dir := writeSweepFixture(t)
	bin := scellisBinary(t)
	cmd := exec.Command("unshare", "-n", "sh", "-c", "ip link set lo down 2>/dev/null; "+bin+" run job.yaml --out offline")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
	out := mustRun(t, cmd)
	if !strings.Contains(out, "verified 4/4") {
		t.Fatalf("offline run did not verify all shards:\n%s", out)
	}
	mustRun(t, scellisCmd(t, dir, "run", "job.yaml", "--out", "online"))
	a, _ := os.ReadFile(filepath.Join(dir, "offline", "result.json"))
	b, _ := os.ReadFile(filepath.Join(dir, "online", "result.json"))
	if !bytes.Equal(a, b) {
		t.Fatal("offline and online runs differ")
	}
}

// The README's first command: the whole federation on this machine.
func TestDemo(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("starts a federation of child processes")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), untilCLI())
	defer cancel()
	cmd := exec.CommandContext(ctx, scellisBinary(t), "demo", "--dir", filepath.Join(dir, "demo"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"run done", "is intact", "receipt chain intact", "verified 9/9 shards", "processes stopped"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
	// hospital-4 dies after the first round: a round that had it in its
	// cohort shows it dropped; one planned after its death shows it
	// absent. Which comes first depends on when the kill lands.
	if !strings.Contains(string(out), "dropped: hospital-4") && !strings.Contains(string(out), "absent: hospital-4") {
		t.Fatalf("no round shows hospital-4 dropped or absent:\n%s", out)
	}
	// The DP-SGD model beats the majority-class baseline clearly on
	// held-out hospitals (AUC 0.5 for any constant prediction).
	var auc float64
	if i := strings.Index(string(out), "held-out (4 new hospitals"); i < 0 {
		t.Fatalf("demo output lacks the held-out evaluation:\n%s", out)
	} else if _, err := fmt.Sscanf(string(out[i:])[strings.Index(string(out[i:]), "AUC ")+4:], "%g", &auc); err != nil || auc < 0.7 {
		t.Fatalf("held-out AUC %v (%v), want at least 0.7:\n%s", auc, err, out[i:])
	} else {
		t.Logf("%s", strings.SplitN(string(out[i:]), "\n", 2)[0])
	}
}
