package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
)

// needNumpy skips a test when Debian's python3 cannot import numpy
// (apt-get install python3-numpy).
func needNumpy(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import numpy").Run(); err != nil {
		t.Skipf("/usr/bin/python3 cannot import numpy (apt-get install python3-numpy): %v", err)
	}
}

// trainerJoinTimeout gives the silos of a trainer run time to join a
// round: they run the trainer in the mask phase of secure aggregation,
// which the aggregators' round_join_timeout bounds (an interpreter start
// per step and silo, seconds for PyTorch).
func (c *cluster) trainerJoinTimeout(d string) {
	for _, a := range c.aggs {
		b, err := os.ReadFile(filepath.Join(c.dir, a+".yaml"))
		if err != nil {
			c.t.Fatal(err)
		}
		c.write(a+".yaml", strings.Replace(string(b), "round_join_timeout: 4s", "round_join_timeout: "+d, 1))
	}
}

// startSilos starts each silo with its config, name.yaml.
func (c *cluster) startSilos(silos []string) {
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
}

// writeSoftmaxRows writes n rows of four features and a label 0–2 that
// the features predict (the numpy trainer's data, trainer/testdata).
func writeSoftmaxRows(c *cluster, name string, seed uint64, n int) {
	var sb strings.Builder
	sb.WriteString("a,b,c,d,label\n")
	r := rand.New(rand.NewPCG(seed, 7))
	for range n {
		y := r.IntN(3)
		fmt.Fprintf(&sb, "%.3f,%.3f,%.3f,%.3f,%d\n", float64(y)+r.NormFloat64()*0.6, r.NormFloat64(), -float64(y)+r.NormFloat64()*0.6, 1.0, y)
	}
	c.write(name, sb.String())
}

// refused runs cmd, which must exit 2 with a diagnostic of code on its
// standard error; it returns that.
func refused(t *testing.T, cmd *exec.Cmd, code string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), code) {
		t.Fatalf("%v: %v, want exit 2 with %s\nstdout:\n%s\nstderr:\n%s", cmd.Args, err, code, stdout.String(), stderr.String())
	}
	return stderr.String()
}

// A trainer run evaluates through its trainer's evaluate, as a built-in
// model's run evaluates: real processes (an aggregator, four silos), a
// plain-numpy trainer (trainer/testdata/numpy), update-level DP and secure
// aggregation, evaluation.holdout with every: 2. Each silo trains on its
// training rows only and scores the global model on its held-out rows in
// the sandbox; the held-out accuracy reaches fl watch, for the middle and
// the final evaluation step, as one silo-level record per silo (the
// noised count of examples is the number of silos), and each evaluation
// is charged to the silos' ledgers like a training round. A fourth silo,
// whose max_model_params is below the trainer's 15 weights, declines every
// step with SC9213 (a trainer run's size is its trainer's, not 0). The
// exported model is scored by scellis model eval --trainer DIR in the
// sandbox, close to what the federation measured; without the trainer's
// directory, or with another trainer's, model eval refuses it (SC9401).
func TestTrainerFederatedEvaluation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run with a Python trainer")
	}
	needNumpy(t)
	silos := []string{"s1", "s2", "s3", "small"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	c.trainerJoinTimeout("3m")
	src, err := os.ReadFile("../../trainer/testdata/numpy/train.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"tiny", "other", "data"} {
		if err := os.MkdirAll(filepath.Join(c.dir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.write("tiny/train.py", string(src))
	c.write("other/train.py", string(src)+"# another trainer\n")
	mustRun(t, scellisCmd(t, c.dir, "trainer", "init", "tiny"))
	mustRun(t, scellisCmd(t, c.dir, "trainer", "init", "other"))
	var check struct {
		Hash   string `json:"hash"`
		Params int    `json:"params"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, scellisCmd(t, c.dir, "--json", "trainer", "check", "tiny"))), &check); err != nil || check.Params != 15 {
		t.Fatalf("trainer check: %v %+v", err, check)
	}
	for i, s := range silos {
		writeSoftmaxRows(c, fmt.Sprintf("data/%s.csv", s), uint64(i+1), 240)
		policy := "  min_cohort: 3\n  trainers:\n    - {name: tiny, hash: " + check.Hash + ", interpreter: /usr/bin/python3, cpu_seconds: 120, memory_mb: 2048, wall: 3m}\n"
		if s == "small" {
			policy += fmt.Sprintf("  max_model_params: %d\n", check.Params-1)
		}
		c.writeSilo(siloConfig{name: s, datasets: []siloDataset{{name: "rows", path: "data/" + s + ".csv", label: "label", epsilon: 1e6, unit: "silo"}}, policy: policy})
	}
	writeSoftmaxRows(c, "data/test.csv", 99, 600)
	c.write("run.yaml", `name: tiny-eval
strategy: {use: fedavg, params: {lr: 0.2, epochs: 3, batch_size: 16}}
trainer: tiny
dataset: rows
rounds: 4
cohort: {min: 3}
privacy: {clip: 4.0, sigma: 0.005, eval_sigma: 0.003}
evaluation: {holdout: 0.25, every: 2}
secure_aggregation: true
seed: 3
`)
	mustRun(t, scellisCmd(t, c.dir, "config", "check", "run.yaml"))
	c.startAggregators()
	c.startSilos(silos)
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	out, errs, err := c.cli("alice", "--json", "fl", "watch", id)
	if err != nil {
		for _, s := range silos {
			b, _ := os.ReadFile(filepath.Join(c.dir, s+".log"))
			t.Logf("%s.log:\n%s", s, b)
		}
		t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
	}
	finalRecord(t, out)
	var steps []fl.RoundSummary
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, `"final":`) {
			continue
		}
		var row fl.RoundSummary
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		steps = append(steps, row)
	}
	// Four training rounds, an evaluation after the second and one at
	// the end: six steps, each summed from s1–s3, each declined by small.
	var evals []fl.RoundSummary
	for _, row := range steps {
		if len(row.Participants) != 3 || !strings.HasPrefix(row.Declined["small"], "SC9213") {
			t.Fatalf("step %d (%s): participants %v, small declined %q; want s1–s3, small SC9213:\n%s", row.Round, row.Step, row.Participants, row.Declined["small"], out)
		}
		if row.Step == fl.StepEval {
			evals = append(evals, row)
		}
	}
	if len(steps) != 6 || len(evals) != 2 || evals[0].Round != 2 || evals[1].Round != 5 {
		t.Fatalf("want 6 steps with evaluations at rounds 2 and 5:\n%s", out)
	}
	for _, e := range evals {
		// Under DP each silo's metrics are one record: the noised count
		// of "examples" is the three silos (noise σ·√11 = 0.01 each).
		if math.Abs(e.EvalRows-3) > 0.5 || !(e.EvalAcc > 0.6) {
			t.Fatalf("evaluation step %d: %v held-out examples (want about 3 silos), accuracy %v:\n%s", e.Round, e.EvalRows, e.EvalAcc, out)
		}
	}
	table := c.mustCLI("alice", "fl", "watch", id)
	row := fmt.Sprintf("%5d  %-5s %-5d %s %s %s %s", 5, fl.StepEval, 3, metric(0, false), metric(0, false), metric(evals[1].EvalLoss, true), metric(evals[1].EvalAcc, true))
	if !strings.Contains(table, row) {
		t.Fatalf("fl watch does not show the final evaluation's held-out loss and accuracy:\n%s", table)
	}
	if st := c.mustCLI("alice", "fl", "status", id); !strings.Contains(st, "state done; 6 of 6 rounds done") {
		t.Fatalf("fl status:\n%s", st)
	}
	// Every step is charged: four training releases and two evaluations.
	for _, s := range silos {
		led := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join(s, "data", "privacy.ledger")))
		want := len(steps)
		if s == "small" {
			want = 0
		}
		if n := strings.Count(led, `"consumer"`); n != want {
			t.Fatalf("%s's ledger has %d charges, want %d:\n%s", s, n, want, led)
		}
	}
	// The exported model, scored by its trainer's evaluate in the
	// sandbox through model eval.
	c.mustCLI("alice", "fl", "model", id, "--out", "model.json")
	var ev struct {
		Rows     int      `json:"rows"`
		Accuracy *float64 `json:"accuracy"`
		Loss     *float64 `json:"loss"`
		Trainer  string   `json:"trainer"`
	}
	raw := mustRun(t, scellisCmd(t, c.dir, "--json", "model", "eval", "model.json", "--trainer", "tiny", "--data", "data/test.csv"))
	if err := json.Unmarshal([]byte(raw), &ev); err != nil || ev.Rows != 600 || ev.Accuracy == nil || ev.Loss == nil || ev.Trainer != check.Hash {
		t.Fatalf("model eval --trainer: %v\n%s", err, raw)
	}
	t.Logf("held-out accuracy: federated (mean over silos, DP) %.4f, model eval on 600 fresh rows %.4f", evals[1].EvalAcc, *ev.Accuracy)
	if math.Abs(*ev.Accuracy-evals[1].EvalAcc) > 0.1 {
		t.Fatalf("the federation measured a held-out accuracy of %.4f; model eval on fresh rows %.4f", evals[1].EvalAcc, *ev.Accuracy)
	}
	if text := mustRun(t, scellisCmd(t, c.dir, "model", "eval", "model.json", "--trainer", "tiny", "--data", "data/test.csv")); !strings.Contains(text, fmt.Sprintf("\naccuracy  %.4f\n", *ev.Accuracy)) {
		t.Fatalf("model eval --trainer does not print the accuracy %.4f:\n%s", *ev.Accuracy, text)
	}
	if same := trainerAccuracy(t, c.dir, "tiny", "--model", "model.json", "data/test.csv"); same != *ev.Accuracy {
		t.Fatalf("model eval (%v) and trainer eval (%v) disagree on the same model and rows", *ev.Accuracy, same)
	}
	if errs := refused(t, scellisCmd(t, c.dir, "model", "eval", "model.json", "--data", "data/test.csv"), "SC9401"); !strings.Contains(errs, "--trainer DIR") {
		t.Fatalf("model eval of a trainer's model without its directory does not say how:\n%s", errs)
	}
	refused(t, scellisCmd(t, c.dir, "model", "eval", "model.json", "--trainer", "other", "--data", "data/test.csv"), "SC9401")
}
