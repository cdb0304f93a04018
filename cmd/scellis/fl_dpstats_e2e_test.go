package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
)

// hospitalRanges are privacy.feature_bounds for datagen hospitals as a
// data dictionary would give them: each feature's plausible range.
const hospitalRanges = "[[0, 120], [0, 1], [10, 80], [50, 300], [20, 600], [50, 500], [0, 1], [0, 40], [0, 20]]"

// DP statistics that cannot strand a run, and a privacy plan run as given
// (issue 30), through real processes: one aggregator, four silos.
//
// Two runs release their statistics at σ = 20000 over 80 rows: the noised
// row count is below one about half the time, which paused such a run for
// good (the leader retried the same cached release and `fl resume` failed
// the same way). Both complete now, their standardiser built from the
// post-processed sums: the count at least twice its noise, every mean
// inside its feature's range.
//
// Then `scellis privacy plan` plans a run of four rounds with evaluation
// every two rounds and a public row count, simulating its statistics
// shares on the silos' data, and writes the run file; launched as given on
// silos whose budget is the plan's ε, it completes all seven steps, each
// silo charged for each step once, within the budget.
func TestFLDPStatisticsAndPlan(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"s1", "s2", "s3", "s4"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "150", "--seed", "3", "--out", "data"))
	if err := os.MkdirAll(filepath.Join(c.dir, "tiny"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range silos {
		// The first 20 rows of each site: a dataset of its own.
		lines := strings.SplitAfterN(readFile(t, c.dir, fmt.Sprintf("data/hospital-%d.csv", i+1)), "\n", 22)
		c.write(fmt.Sprintf("tiny/hospital-%d.csv", i+1), strings.Join(lines[:21], ""))
		c.writeSilo(siloConfig{name: s, datasets: []siloDataset{
			{name: "patients", path: fmt.Sprintf("data/hospital-%d.csv", i+1), epsilon: 3, extra: "public_rows: true"},
			{name: "tiny", path: fmt.Sprintf("tiny/hospital-%d.csv", i+1), epsilon: 10},
		}, policy: "  min_cohort: 3\n"})
	}
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	noisyCountRuns(t, c)
	plannedRun(t, c, silos)
}

// noisyCountRuns runs TestFLDPStatisticsAndPlan's two runs whose noised
// row count is as likely negative as not (see there).
func noisyCountRuns(t *testing.T, c *cluster) {
	const sumsSigma = 20000
	var ids []string
	for i := range 2 {
		name := fmt.Sprintf("noisy-%d", i)
		c.write(name+".yaml", fmt.Sprintf(`name: %s
strategy: {use: fedavg, params: {lr: 0.5, steps: 2}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: tiny
rounds: 1
privacy: {clip: 1.0, sigma: 5, q: 0.5, steps: 2, sums_sigma: %d, feature_bounds: %s}
seed: %d
`, name, sumsSigma, hospitalRanges, i))
		ids = append(ids, strings.TrimSpace(c.mustCLI("alice", "fl", "launch", name+".yaml")))
	}
	spec, err := fl.ParseRunSpec("noisy.yaml", []byte("name: x\nstrategy: fedavg\nmodel: {inputs: 9}\ndataset: d\nrounds: 1\nprivacy: {clip: 1, sigma: 1, feature_bounds: "+hospitalRanges+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	floor := 2 * fl.StatsNoise(sumsSigma, 9, 4, false)
	for i, id := range ids {
		if out, errs, err := c.cli("alice", "fl", "watch", id); err != nil || !strings.Contains(out, "run done") {
			t.Fatalf("the run with a noised row count did not complete (%v):\n%s%s", err, out, errs)
		}
		file := fmt.Sprintf("noisy-%d.json", i)
		c.mustCLI("alice", "fl", "model", id, "--out", file)
		var f fl.ModelFile
		if err := json.Unmarshal([]byte(readFile(t, c.dir, file)), &f); err != nil {
			t.Fatal(err)
		}
		st, b := f.Standardization, spec.Bounds()
		if !(st.Rows >= floor*(1-1e-12)) || len(st.Mean) != 9 {
			t.Fatalf("run %d's statistics count %v rows; twice the noise is %v", i, st.Rows, floor)
		}
		for j := range 9 {
			lo, hi := b.Center[j]-b.Half[j], b.Center[j]+b.Half[j]
			if !(st.Mean[j] >= lo && st.Mean[j] <= hi) || !(st.Std[j] > 0 && st.Std[j] <= b.Half[j]*(1+1e-12)) {
				t.Fatalf("run %d, feature %d: mean %v std %v outside [%v, %v]", i, j, st.Mean[j], st.Std[j], lo, hi)
			}
		}
	}
}

// plannedRun plans a run with privacy plan and runs it as given (see
// TestFLDPStatisticsAndPlan).
func plannedRun(t *testing.T, c *cluster, silos []string) {
	const eps = 3.0
	c.write("run.yaml", `name: planned
strategy: {use: fedprox, params: {mu: 0.1, lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
rounds: 4
privacy: {clip: 1.0, sigma: 1, q: 0.1, steps: 1, public_rows: true, feature_bounds: `+hospitalRanges+`}
evaluation: {holdout: 0.2, every: 2}
seed: 4
`)
	plan := mustRun(t, scellisCmd(t, c.dir, "privacy", "plan", "run.yaml", "--epsilon", fmt.Sprint(eps), "--delta", "1e-5",
		"--data", "data", "--repeats", "2", "--out", "planned.yaml"))
	if !strings.Contains(plan, "a statistics step, 4 training rounds, 2 evaluation steps") || !strings.Contains(plan, "* ") {
		t.Fatalf("the plan does not price the whole run or pick a share:\n%s", plan)
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "planned.yaml"))
	table, errs, err := c.cli("alice", "fl", "watch", id)
	if err != nil || !strings.Contains(table, "run done") {
		t.Fatalf("the planned run did not complete (%v):\n%s\n%s%s", err, plan, table, errs)
	}
	steps := []string{"stats", "train", "train", "eval ", "train", "train", "eval "}
	for r, step := range steps {
		if !strings.Contains(table, fmt.Sprintf("\n%5d  %s 4 ", r, step)) {
			t.Fatalf("step %d is not a %s step of four silos:\n%s", r, step, table)
		}
	}
	for _, s := range silos {
		checkLedger(t, c, s) // verifies, and no step is charged twice
		out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join(s, "data", "privacy.ledger"), "--dataset", "patients"))
		var l struct {
			Datasets []struct {
				Spent   float64 `json:"spent_epsilon"`
				Charges int     `json:"charges"`
			} `json:"datasets"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Datasets) != 1 {
			t.Fatalf("%s's ledger: %v\n%s", s, err, out)
		}
		if d := l.Datasets[0]; d.Charges != len(steps) || !(d.Spent <= eps) || math.IsNaN(d.Spent) {
			t.Errorf("%s spent ε = %v in %d charges; the plan allows %v in %d", s, d.Spent, d.Charges, eps, len(steps))
		}
	}
}
