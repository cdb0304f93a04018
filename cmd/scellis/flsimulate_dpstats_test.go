package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
)

// A DP run at ε = 1 whose statistics get a small share of it (0.12, about the least one
// Gaussian release can claim at δ = 1e-5 with the default Rényi orders), over
// three small sites, completes in fl simulate every time (issue 30: the
// noised row count, here about three times the rows in noise, was
// negative in about a third of such runs, and the run failed). The run is
// planned by privacy plan, so it is one a user gets at ε = 1; real binary,
// ten repeats (the noise differs in each).
func TestFLSimulateDPStatisticsAtEpsilonOne(t *testing.T) {
	t.Parallel() // its own processes and directories
	dir := t.TempDir()
	mustRun(t, scellisCmd(t, dir, "datagen", "hospitals", "--sites", "3", "--rows", "40", "--seed", "9", "--out", "sites"))
	spec := `name: eps-one
strategy: {use: fedprox, params: {mu: 0.1, lr: 0.5, steps: 5}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
rounds: 5
privacy: {clip: 1.0, sigma: 1, q: 0.1, steps: 5, feature_bounds: ` + hospitalRanges + `}
evaluation: {holdout: 0.2}
seed: 2
`
	if err := os.WriteFile(filepath.Join(dir, "run.yaml"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	plan := mustRun(t, scellisCmd(t, dir, "privacy", "plan", "run.yaml", "--epsilon", "1", "--delta", "1e-5",
		"--data", "sites", "--stats-share", "0.12", "--out", "planned.yaml"))
	planned, err := fl.LoadRunSpec(filepath.Join(dir, "planned.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	noise := fl.StatsNoise(planned.SumsSigma, 9, 3, false)
	if noise < 2*96 { // 3·32 training rows
		t.Fatalf("the statistics' noise %.3g is not large against the rows: the test has no power\n%s", noise, plan)
	}
	var negative int
	for range 10 {
		out := mustRun(t, scellisCmd(t, dir, "--json", "fl", "simulate", "planned.yaml", "--data", "sites", "--out", "model.json"))
		var stats, eval *fl.RoundSummary
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var row fl.RoundSummary
			if json.Unmarshal([]byte(line), &row) != nil {
				continue
			}
			switch row.Step {
			case fl.StepStats:
				stats = &row
			case fl.StepEval:
				eval = &row
			}
		}
		if stats == nil || eval == nil {
			t.Fatalf("the simulated run has no statistics or evaluation step:\n%s", out)
		}
		if stats.Sums["rows"] < 1 {
			negative++ // refused before issue 30
		}
		mf, err := fl.ReadModelFile(filepath.Join(dir, "model.json"))
		if err != nil || mf.Standardization.Rows < 2*noise*(1-1e-12) {
			t.Fatalf("model file: %v, statistics of %v rows (twice the noise: %v)", err, mf.Standardization.Rows, 2*noise)
		}
	}
	t.Logf("10 of 10 runs completed; %d had a noised row count below one", negative)
}
