package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
)

// needTorch skips a test when Debian's python3 cannot import torch and
// numpy (apt-get install python3-torch python3-numpy).
func needTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("/usr/bin/python3 cannot import torch and numpy (apt-get install python3-torch python3-numpy): %v", err)
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

// docs/trainers.md's walkthrough, run from the page's blocks and commands:
// a data scientist's PyTorch CNN (examples/trainer-cnn) trained by a
// federation of real processes: 3 aggregators and 4 silos, each silo
// running the trainer in its sandbox on a non-IID split of scellis
// datagen glyphs, under FedProx, update-level DP (each silo clips, noises
// and charges the update the trainer returns) and secure aggregation. A
// fifth silo, whose policy does not list the trainer, declines every
// round with SC9502 and the rounds go on without it; a sixth, whose policy
// gives the trainer too little memory, declines a second run's round with
// SC9505, charging nothing, and that round goes on without it. Each silo
// holds out a fifth of its rows, on which the final evaluation step scores
// the model with the trainer's evaluate (charged like a round); the
// federation's held-out accuracy is near the model's on test.csv. The
// global model's held-out accuracy, scored by the trainer's own evaluate,
// is within 3 points of the same CNN trained centrally on the union of the
// four sites' training rows for as many passes over the data.
func TestTrainerCNNFederation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run with PyTorch")
	}
	needTorch(t)
	silos := []string{"s1", "s2", "s3", "s4", "refuser", "starved"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 3, append(ms, member{"alice", "researcher"})...)
	c.trainerJoinTimeout("5m")
	// The trainer is docs/trainers.md's, which is examples/trainer-cnn's.
	src := docBlock(t, "trainers.md", "python", "train.py")
	if b, err := os.ReadFile("../../examples/trainer-cnn/train.py"); err != nil || string(b) != src {
		t.Fatalf("docs/trainers.md's train.py is not examples/trainer-cnn/train.py (%v)", err)
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "cnn"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.write("cnn/train.py", src)
	// The page's local commands, as they are.
	local := docCommands(t, docBlock(t, "trainers.md", "sh", "try it locally"))
	for _, args := range local {
		mustRun(t, scellisCmd(t, c.dir, args...))
	}
	var check struct {
		Hash   string `json:"hash"`
		Params int    `json:"params"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, scellisCmd(t, c.dir, "--json", "trainer", "check", "cnn"))), &check); err != nil || check.Params == 0 {
		t.Fatalf("trainer check: %v %+v", err, check)
	}
	// The page's site config for every silo: its name, data file and
	// folder, the trainer's hash; the refuser lists no trainer, the starved
	// silo gives it too little memory to load torch.
	site := docBlock(t, "trainers.md", "yaml", "site-1.yaml")
	for i, s := range silos {
		y := strings.ReplaceAll(site, "site-1", s)
		y = strings.Replace(y, "data/"+s+".csv", fmt.Sprintf("data/site-%d.csv", min(i+1, 5)), 1)
		y = strings.Replace(y, "sha256:HASH-FROM-TRAINER-CHECK", check.Hash, 1)
		switch s {
		case "refuser":
			y = y[:strings.Index(y, "  trainers:")]
		case "starved":
			y = strings.Replace(y, "memory_mb: 4096", "memory_mb: 150", 1)
		}
		c.write(s+".yaml", y)
		mustRun(t, scellisCmd(t, c.dir, "config", "check", s+".yaml"))
	}
	runYAML := docBlock(t, "trainers.md", "yaml", "run.yaml")
	spec, err := fl.ParseRunSpec("run.yaml", []byte(runYAML))
	if err != nil {
		t.Fatal(err)
	}
	rounds := spec.Rounds
	epochs, err := strconv.Atoi(fmt.Sprint(spec.Params["epochs"]))
	if err != nil {
		t.Fatalf("docs/trainers.md's run.yaml: epochs %v", spec.Params["epochs"])
	}
	c.write("run.yaml", strings.Replace(runYAML, "cohort: {min: 3}", "cohort: {min: 3, silos: [s1, s2, s3, s4, refuser]}", 1))
	c.startAggregators()
	c.startSilos(silos)
	// The page's federate commands: launch, watch, model, eval.
	federate := docCommands(t, docBlock(t, "trainers.md", "sh", "federate"))
	if len(federate) != 5 || federate[0][1] != "launch" || federate[1][1] != "watch" || federate[2][1] != "model" || federate[3][1] != "eval" || federate[4][1] != "export" {
		t.Fatalf("docs/trainers.md's federate block is not launch, watch, model, eval, export: %q", federate)
	}
	start := time.Now()
	id := strings.TrimSpace(c.mustCLI("alice", federate[0]...))
	withID := func(args []string) []string {
		out := slices.Clone(args)
		for i, a := range out {
			if a == "RUN_ID" {
				out[i] = id
			}
		}
		return out
	}
	table, _, err := c.cli("alice", withID(federate[1])...)
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
	// The final evaluation step: the four silos' trainers scored the
	// model on their held-out rows; its held-out accuracy (the mean of the
	// silos', noised) is the table's held-ac.
	evalRow := regexp.MustCompile(fmt.Sprintf(`\n%5d  eval  4 +- +- +[0-9.]+ +([0-9.]+) `, rounds)).FindStringSubmatch(table)
	if evalRow == nil {
		t.Fatalf("no final evaluation step summed by the four trainer silos:\n%s", table)
	}
	heldAcc, _ := strconv.ParseFloat(evalRow[1], 64)
	if !strings.Contains(table, "refuser declined: SC9502") {
		t.Fatalf("the silo whose policy does not list the trainer did not decline with SC9502:\n%s", table)
	}
	// Each trainer silo charged its ledger once per round (update-level
	// DP: the silo's mechanism, whatever the trainer did); the refuser
	// charged nothing.
	for _, s := range silos {
		out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join(s, "data", "privacy.ledger")))
		want := rounds + 1 // and the evaluation
		if s == "refuser" || s == "starved" {
			want = 0
		}
		if n := strings.Count(out, `"consumer"`); n != want {
			t.Fatalf("%s's ledger has %d charges, want %d:\n%s", s, n, want, out)
		}
	}
	c.mustCLI("alice", withID(federate[2])...)
	if out := mustRun(t, scellisCmd(t, c.dir, federate[3]...)); !strings.Contains(out, "accuracy") {
		t.Fatalf("trainer eval of the federated model:\n%s", out)
	}
	// The federated model leaves as ONNX too: the trainer's export, whose
	// tensors hold the model file's weights.
	mustRun(t, scellisCmd(t, c.dir, federate[4]...))
	checkONNXWeights(t, filepath.Join(c.dir, "model.onnx"), filepath.Join(c.dir, "model.json"), filepath.Join(c.dir, "cnn"))
	fed := trainerAccuracy(t, c.dir, "cnn", "--model", "model.json", "data/test.csv")
	// The same CNN, trained centrally on the union of the four sites'
	// training rows (the rows each silo did not hold out) for as many
	// passes (rounds × local epochs), from the same init, with the run's
	// parameters.
	var union *model.Dataset
	for i, s := range silos[:4] {
		d, err := model.LoadCSV(filepath.Join(c.dir, "data", fmt.Sprintf("site-%d.csv", i+1)), "label")
		if err != nil {
			t.Fatal(err)
		}
		train, _, err := fl.HoldOut(content.Ref(id), s, d, spec.Eval.Holdout)
		if err != nil {
			t.Fatal(err)
		}
		if union == nil {
			union = train
		} else {
			union = concatRows(union, train)
		}
	}
	var csv bytes.Buffer
	if err := model.WriteCSV(&csv, union); err != nil {
		t.Fatal(err)
	}
	c.write("union.csv", csv.String())
	args := []string{"trainer", "train", "cnn", "--data", "union.csv", "--out", "central.npy", "--param", fmt.Sprintf("epochs=%d", rounds*epochs)}
	for _, k := range []string{"lr", "momentum", "batch_size"} {
		args = append(args, "--param", fmt.Sprintf("%s=%v", k, spec.Params[k]))
	}
	mustRun(t, scellisCmd(t, c.dir, args...))
	central := trainerAccuracy(t, c.dir, "cnn", "--weights", "central.npy", "data/test.csv")
	t.Logf("held-out accuracy: federated %.3f (the silos' held-out rows, by the federation: %.3f), central %.3f (%d weights)", fed, heldAcc, central, check.Params)
	if math.Abs(heldAcc-fed) > 0.1 {
		t.Fatalf("the federation's held-out accuracy %.3f is far from the model's on test.csv, %.3f", heldAcc, fed)
	}
	if fed < central-0.03 {
		t.Fatalf("the federated CNN's held-out accuracy %.3f is more than 3 points below central training's %.3f", fed, central)
	}
	if fed < 0.5 {
		t.Fatalf("the federated CNN learned little: held-out accuracy %.3f", fed)
	}
	// A trainer that fails in a silo (here: out of the memory its policy
	// gives it) is a coded decline that charges nothing; the round goes
	// on with the other three.
	c.write("run2.yaml", strings.NewReplacer("name: cnn-glyphs", "name: cnn-starved", fmt.Sprintf("rounds: %d", rounds), "rounds: 1",
		"cohort: {min: 3}", "cohort: {min: 3, silos: [s1, s2, s3, starved]}", "evaluation: {holdout: 0.2}\n", "").Replace(runYAML))
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

// docBlock is the block of docs/FILE in language lang whose first line is
// the comment "# name" (returned without that line).
func docBlock(t testing.TB, file, lang, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", file))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```" + lang + "\n# " + regexp.QuoteMeta(name) + "\n(.*?)```").FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatalf("docs/%s has no %s block # %s", file, lang, name)
	}
	return m[1]
}

// docCommands splits a shell block into the argument lists of its scellis
// commands (the word scellis dropped).
func docCommands(t testing.TB, block string) [][]string {
	t.Helper()
	var out [][]string
	for _, line := range strings.Split(block, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] != "scellis" {
			t.Fatalf("a command of the walkthrough is not a scellis command: %q", line)
		}
		out = append(out, f[1:])
	}
	return out
}
