package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A trainer run refuses SCAFFOLD (SC9511, exit 2): a trainer returns its
// trained weights, not the control variates SCAFFOLD's server step sums.
// By its catalog name, config check and fl launch refuse it at the run
// file's strategy line; given as a path to a copy of the strategy (any
// strategy that sizes its update itself), config check refuses it when
// it resolves the strategy.
func TestTrainerRunRefusesScaffold(t *testing.T) {
	t.Parallel()
	needTorch(t)
	dir := t.TempDir()
	src, err := os.ReadFile("../../trainer/testdata/numpy/train.py")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) { writeFileIn(t, dir, name, body) }
	write("tiny/train.py", string(src))
	mustRun(t, scellisCmd(t, dir, "trainer", "init", "tiny"))
	scaffold, err := os.ReadFile("../../catalog/builtin/scaffold.star")
	if err != nil {
		t.Fatal(err)
	}
	write("drift.star", string(scaffold))
	run := func(strategy string) string {
		return "name: tiny-scaffold\nstrategy: " + strategy + "\ntrainer: tiny\ndataset: rows\nrounds: 2\ncohort: {min: 3}\nprivacy: {clip: 4.0, sigma: 0.005}\nsecure_aggregation: true\n"
	}
	write("run.yaml", run("{use: scaffold, params: {lr: 0.1}}"))
	write("run-path.yaml", run("{use: ./drift.star, params: {lr: 0.1}}"))
	write("run-fedprox.yaml", run("{use: fedprox, params: {lr: 0.1, mu: 0.01}}"))
	refused := func(where string, args ...string) {
		t.Helper()
		out, err := scellisCmd(t, dir, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "SC9511") || !strings.Contains(string(out), where) {
			t.Fatalf("scellis %s: want SC9511 at %s, exit 2; got %v\n%s", strings.Join(args, " "), where, err, out)
		}
	}
	refused("run.yaml:2", "config", "check", "run.yaml")
	refused("run.yaml:2", "fl", "launch", "run.yaml")
	refused("run-path.yaml", "config", "check", "run-path.yaml")
	// The same run with FedProx is accepted.
	mustRun(t, scellisCmd(t, dir, "config", "check", "run-fedprox.yaml"))
}

// writeFileIn writes body to dir/name, making its folder.
func writeFileIn(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
