package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// needTorch skips a test when Debian's python3 cannot import torch and
// numpy (apt-get install python3-torch python3-numpy).
func needTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("/usr/bin/python3 cannot import torch and numpy (apt-get install python3-torch python3-numpy): %v", err)
	}
}

// copyTree copies the files of src into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// trainerAccuracy scores weights (a model file or an .npy) with the
// trainer's evaluate on the held-out rows, through scellis trainer eval.
func trainerAccuracy(t *testing.T, dir, trainerDir, flag, weights, data string) float64 {
	t.Helper()
	out := mustRun(t, scellisCmd(t, dir, "--json", "trainer", "eval", trainerDir, flag, weights, "--data", data))
	var r struct {
		Examples int      `json:"examples"`
		Accuracy *float64 `json:"accuracy"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Accuracy == nil {
		t.Fatalf("trainer eval: %v\n%s", err, out)
	}
	return *r.Accuracy
}

// A data scientist's PyTorch CNN (examples/trainer-cnn) trained by a
// federation of real processes: 3 aggregators and 4 silos, each silo
// running the trainer in its sandbox on a non-IID split of scellis
// datagen glyphs, under FedProx, update-level DP (each silo clips, noises
// and charges the update the trainer returns) and secure aggregation. A
// fifth silo, whose policy does not list the trainer, declines every
// round with SC9502 and the rounds go on without it; a sixth, whose policy
// gives the trainer too little memory, declines a second run's round with
// SC9505, charging nothing, and that round goes on without it. The global model's
// held-out accuracy, scored by the trainer's own evaluate, is within 3
// points of the same CNN trained centrally on the union of the four
// sites for as many passes over the data.
func TestTrainerCNNFederation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run with PyTorch")
	}
	needTorch(t)
	const rounds, epochs = 5, 3
	silos := []string{"s1", "s2", "s3", "s4", "refuser", "starved"}
	var ms []member
	for _, s := range silos {
		ms = append(ms, member{s, "silo"})
	}
	c := newCluster(t, "consortium", 3, append(ms, member{"alice", "researcher"})...)
	for _, a := range c.aggs {
		// The silos train in the mask phase of secure aggregation, which
		// round_join_timeout bounds: a PyTorch round takes seconds.
		b, err := os.ReadFile(filepath.Join(c.dir, a+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		c.write(a+".yaml", strings.Replace(string(b), "round_join_timeout: 4s", "round_join_timeout: 5m", 1))
	}
	mustRun(t, scellisCmd(t, c.dir, "datagen", "glyphs", "--sites", "5", "--rows", "300", "--test", "1000", "--out", "data"))
	src, err := filepath.Abs("../../examples/trainer-cnn")
	if err != nil {
		t.Fatal(err)
	}
	copyTree(t, src, filepath.Join(c.dir, "cnn"))
	mustRun(t, scellisCmd(t, c.dir, "trainer", "init", "cnn"))
	var check struct {
		Hash   string `json:"hash"`
		Params int    `json:"params"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, scellisCmd(t, c.dir, "--json", "trainer", "check", "cnn"))), &check); err != nil || check.Params == 0 {
		t.Fatalf("trainer check: %v %+v", err, check)
	}
	for i, s := range silos {
		memory := 4096
		if s == "starved" {
			memory = 150 // too little to load torch: its trainer fails
		}
		trainers := fmt.Sprintf("  trainers:\n    - name: cnn\n      hash: %s\n      interpreter: /usr/bin/python3\n      cpu_seconds: 300\n      memory_mb: %d\n      wall: 4m\n", check.Hash, memory)
		if s == "refuser" {
			trainers = ""
		}
		file := i + 1
		if s == "starved" {
			file = 5
		}
		c.write(s+".yaml", fmt.Sprintf(`name: %s
identity: %s/identity.key
federation: federation.yaml
data_dir: %s/data
datasets:
  - name: glyphs
    path: data/site-%d.csv
    label: label
    class: confidential
    budget: {epsilon: 1.0e+6, delta: 1.0e-5}
    unit: silo
policy:
  min_cohort: 3
%s`, s, s, s, file, trainers))
		mustRun(t, scellisCmd(t, c.dir, "config", "check", s+".yaml"))
	}
	c.write("run.yaml", fmt.Sprintf(`name: cnn-glyphs
strategy: {use: fedprox, params: {mu: 0.01, lr: 0.03, momentum: 0.9, epochs: %d, batch_size: 16}}
trainer: cnn
dataset: glyphs
rounds: %d
cohort: {min: 3, silos: [s1, s2, s3, s4, refuser]}
privacy: {clip: 10.0, sigma: 0.005}
secure_aggregation: true
seed: 5
`, epochs, rounds))
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	start := time.Now()
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	table, _, err := c.cli("alice", "fl", "watch", id)
	t.Logf("fl watch (%v):\n%s", time.Since(start).Round(time.Second), table)
	if err != nil || !strings.Contains(table, "run done") {
		for _, s := range silos {
			b, _ := os.ReadFile(filepath.Join(c.dir, s+".log"))
			t.Logf("%s.log:\n%s", s, b)
		}
		t.Fatalf("the run did not complete: %v", err)
	}
	for r := range rounds {
		if !strings.Contains(table, fmt.Sprintf("\n%5d  train %-5d ", r, 4)) {
			t.Fatalf("round %d did not sum the four trainer silos:\n%s", r, table)
		}
	}
	if !strings.Contains(table, "refuser declined: SC9502") {
		t.Fatalf("the silo whose policy does not list the trainer did not decline with SC9502:\n%s", table)
	}
	// Each trainer silo charged its ledger once per round (update-level
	// DP: the silo's mechanism, whatever the trainer did); the refuser
	// charged nothing.
	for _, s := range silos {
		out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join(s, "data", "privacy.ledger")))
		want := rounds
		if s == "refuser" || s == "starved" {
			want = 0
		}
		if n := strings.Count(out, `"consumer"`); n != want {
			t.Fatalf("%s's ledger has %d charges, want %d:\n%s", s, n, want, out)
		}
	}
	c.mustCLI("alice", "fl", "model", id, "--out", "model.json")
	fed := trainerAccuracy(t, c.dir, "cnn", "--model", "model.json", "data/test.csv")
	// The same CNN, trained centrally on the union of the four sites for
	// as many passes (rounds × local epochs), from the same init.
	var union strings.Builder
	for i := 1; i <= 4; i++ {
		b, err := os.ReadFile(filepath.Join(c.dir, "data", fmt.Sprintf("site-%d.csv", i)))
		if err != nil {
			t.Fatal(err)
		}
		lines := string(b)
		if i > 1 {
			lines = lines[strings.IndexByte(lines, '\n')+1:]
		}
		union.WriteString(lines)
	}
	c.write("union.csv", union.String())
	mustRun(t, scellisCmd(t, c.dir, "trainer", "train", "cnn", "--data", "union.csv", "--param", "lr=0.03", "--param", "momentum=0.9", "--param", fmt.Sprintf("epochs=%d", rounds*epochs),
		"--param", "batch_size=16", "--out", "central.npy"))
	central := trainerAccuracy(t, c.dir, "cnn", "--weights", "central.npy", "data/test.csv")
	t.Logf("held-out accuracy: federated %.3f, central %.3f (%d weights)", fed, central, check.Params)
	if fed < central-0.03 {
		t.Fatalf("the federated CNN's held-out accuracy %.3f is more than 3 points below central training's %.3f", fed, central)
	}
	if fed < 0.5 {
		t.Fatalf("the federated CNN learned little: held-out accuracy %.3f", fed)
	}
	// A trainer that fails in a silo (here: out of the memory its policy
	// gives it) is a coded decline that charges nothing; the round goes
	// on with the other three.
	c.write("run2.yaml", `name: cnn-starved
strategy: {use: fedprox, params: {mu: 0.01, lr: 0.03, momentum: 0.9, epochs: 1, batch_size: 16}}
trainer: cnn
dataset: glyphs
rounds: 1
cohort: {min: 3, silos: [s1, s2, s3, starved]}
privacy: {clip: 10.0, sigma: 0.005}
secure_aggregation: true
`)
	id2 := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run2.yaml"))
	table2, _, err := c.cli("alice", "fl", "watch", id2)
	t.Logf("fl watch of the run with a starved silo:\n%s", table2)
	if err != nil || !strings.Contains(table2, "run done") || !strings.Contains(table2, "\n    0  train 3     ") ||
		!strings.Contains(table2, "starved declined: SC9505") {
		t.Fatalf("the round did not go on without the silo whose trainer ran out of memory (SC9505): %v", err)
	}
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("starved", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 0 {
		t.Fatalf("the starved silo charged its ledger %d times:\n%s", n, out)
	}
	if log, _ := os.ReadFile(filepath.Join(c.dir, "starved.log")); !strings.Contains(string(log), "declined: SC9505") {
		t.Fatalf("the starved silo's log does not say why it declined:\n%s", log)
	}
}
