package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/silo"
)

// A federated run with real processes: one aggregator, five silos, each
// with its own data, ledger and policy. Update-level DP and secure
// aggregation in a consortium; the ledgers show the accountant's ε for every
// round; a silo whose policy refuses the strategy declines; a silo whose
// budget is spent stops taking part and the others go on. (At round 2 two
// of five decline, below the threshold ⌊2·5/3⌋+1 = 4: the attempt fails and
// the retry leaves the two decliners out, so three sites sum it.)
func TestFLRunWithSilos(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"h1", "h2", "h3", "h4", "h5"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "5", "--rows", "300", "--out", "data"))
	// agg-1 and h1 serve /metrics; h3 logs JSON.
	pp := &ports{t: t}
	aggMetrics, h1Metrics := pp.next(), pp.next()
	pp.release()
	agg1, err := os.ReadFile(filepath.Join(c.dir, "agg-1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c.write("agg-1.yaml", string(agg1)+"metrics_listen: "+aggMetrics+"\n")
	for i, s := range silos {
		strategies := ""
		if s == "h4" {
			strategies = "  strategies: [scaffold]\n"
		}
		budget := 50
		if s == "h3" {
			budget = 20 // two rounds fit (ε 16.5 composed), a third would not
		}
		cfg := hospitalSilo(s, i+1, float64(budget), "silo")
		cfg.policy = strategies + "  min_cohort: 3\n"
		c.writeSilo(cfg)
	}
	for s, extra := range map[string]string{"h1": "metrics_listen: " + h1Metrics + "\n", "h3": "log_format: json\n"} {
		b, _ := os.ReadFile(filepath.Join(c.dir, s+".yaml"))
		c.write(s+".yaml", string(b)+extra)
	}
	c.write("run.yaml", `name: fedavg-hospitals
strategy: {use: fedavg, params: {lr: 0.5, epochs: 2}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 3
privacy: {clip: 5.0, sigma: 0.5}
standardize: local
secure_aggregation: true
seed: 3
`)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	const (
		trainRounds = `scellis_fl_rounds_total{outcome="reduced",step="train"}`
		spent       = `scellis_ledger_spent_epsilon{dataset="patients"}`
	)
	var before map[string]float64
	waitFor(t, "h1's /metrics", untilNoticed(), func() bool { before = scrape(t, h1Metrics); return before != nil })
	if before[spent] != 0 || before[`scellis_ledger_budget_epsilon{dataset="patients"}`] != 50 {
		t.Fatalf("h1's ledger series before the run: spent %v, budget %v", before[spent], before[`scellis_ledger_budget_epsilon{dataset="patients"}`])
	}
	if m := scrape(t, aggMetrics); m == nil || m[trainRounds] != 0 || m[`scellis_raft_state{state="leader"}`] != 1 {
		t.Fatalf("agg-1's /metrics before the run: %v", m)
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	done := make(chan string, 1)
	go func() {
		out, _, _ := c.cli("alice", "fl", "watch", id)
		done <- out
	}()
	// During the run the round and ledger series move.
	var mid, midSilo map[string]float64
	waitFor(t, "a reduced round in agg-1's /metrics", untilRun(), func() bool {
		mid = scrape(t, aggMetrics)
		return mid[trainRounds] >= 1
	})
	midSilo = scrape(t, h1Metrics)
	if midSilo[spent] <= 0 || midSilo[`scellis_silo_rounds_total{outcome="contributed"}`] < 1 {
		t.Fatalf("h1's ledger series did not move after a round: spent %v, contributed %v", midSilo[spent], midSilo[`scellis_silo_rounds_total{outcome="contributed"}`])
	}
	var table string
	select {
	case table = <-done:
	case <-time.After(untilRun()):
		t.Fatal("the run did not finish in 3 minutes")
	}
	aggEnd, endSilo := scrape(t, aggMetrics), scrape(t, h1Metrics)
	if aggEnd[trainRounds] != 3 || aggEnd[`scellis_runs{state="done"}`] != 1 || aggEnd["scellis_secagg_survivors_count"] != 3 ||
		aggEnd[`scellis_secagg_phase_seconds_count{phase="unmask"}`] != 3 || aggEnd[`scellis_data_plane_bytes_total{direction="in",plane="secagg"}`] <= 0 ||
		aggEnd["scellis_raft_apply_seconds_count"] < mid["scellis_raft_apply_seconds_count"] {
		t.Fatalf("agg-1's /metrics after 3 rounds: rounds %v, runs done %v, survivors count %v, unmask phases %v, secagg bytes in %v, applies %v → %v",
			aggEnd[trainRounds], aggEnd[`scellis_runs{state="done"}`], aggEnd["scellis_secagg_survivors_count"], aggEnd[`scellis_secagg_phase_seconds_count{phase="unmask"}`],
			aggEnd[`scellis_data_plane_bytes_total{direction="in",plane="secagg"}`], mid["scellis_raft_apply_seconds_count"], aggEnd["scellis_raft_apply_seconds_count"])
	}
	// Rounds take milliseconds: all three can be over by the time the
	// series are read mid-run, so the series must not go back, and the
	// end state must hold every round's charge.
	if endSilo[spent] < midSilo[spent] || math.Abs(endSilo[`scellis_ledger_remaining_epsilon{dataset="patients"}`]-(50-endSilo[spent])) > 1e-9 ||
		endSilo[`scellis_ledger_charges{dataset="patients"}`] != 3 || endSilo[`scellis_data_plane_bytes_total{direction="out",plane="secagg"}`] <= 0 {
		t.Fatalf("h1's ledger series after 3 rounds: spent %v → %v, remaining %v, charges %v, secagg bytes out %v", midSilo[spent], endSilo[spent],
			endSilo[`scellis_ledger_remaining_epsilon{dataset="patients"}`], endSilo[`scellis_ledger_charges{dataset="patients"}`], endSilo[`scellis_data_plane_bytes_total{direction="out",plane="secagg"}`])
	}
	// Shell completion of run IDs asks the pool (scellis __complete).
	if out := c.mustCLI("alice", "__complete", "fl", "status", ""); !strings.Contains(out, id+"\tfedavg-hospitals, done, 3/3 rounds") {
		t.Fatalf("fl status did not complete the run's ID:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(c.dir, "h3.log")); !strings.Contains(string(b), `{"time":`) || !strings.Contains(string(b), `"member":"h3"`) {
		t.Fatalf("h3 (log_format: json) did not log JSON lines:\n%s", b)
	}
	t.Logf("fl watch:\n%s", table)
	if !strings.Contains(table, "run done") {
		t.Fatalf("run did not complete:\n%s", table)
	}
	for r, want := range []int{4, 4, 3} {
		if !strings.Contains(table, fmt.Sprintf("\n%5d  train %-5d ", r, want)) {
			t.Fatalf("round %d did not have %d participants:\n%s", r, want, table)
		}
	}
	if !strings.Contains(table, "h4 declined: SC9201") || !strings.Contains(table, "h3 declined: SC9207") {
		t.Fatalf("h4's policy refusal or h3's spent budget is not shown:\n%s", table)
	}
	// Differencing: round 1 sums h3, round 2 does not (its budget ran
	// out). Under DP nothing but the noised update is summed — no example
	// count, loss or correct count whose difference would be h3's — and
	// every weight is 1.
	jsonOut, _, _ := c.cli("alice", "--json", "fl", "watch", id)
	trainRows := 0
	for _, line := range strings.Split(strings.TrimSpace(jsonOut), "\n") {
		var row struct {
			Step string             `json:"step"`
			Sums map[string]float64 `json:"sums"`
		}
		if json.Unmarshal([]byte(line), &row) != nil || row.Step != "train" {
			continue
		}
		trainRows++
		if len(row.Sums) != 0 {
			t.Fatalf("a DP training round released sums %v beside the update:\n%s", row.Sums, line)
		}
	}
	if trainRows != 3 {
		t.Fatalf("fl watch --json showed %d training rounds, want 3:\n%s", trainRows, jsonOut)
	}
	checkFLManagement(t, c, id)
	// Each participating silo's ledger holds one charge per round and verifies.
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("h1", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 3 {
		t.Fatalf("h1's ledger has %d charges, want 3:\n%s", n, out)
	}
	mustRun(t, scellisCmd(t, c.dir, "ledger", "verify", "--ledger", filepath.Join("h1", "data", "privacy.ledger")))
	// A run that asks silo-level datasets for q = 1e-6: no sampling hides
	// a silo's participation, so the silos refuse it (charging it at q
	// would undercharge ~10^4-fold) and nothing is charged.
	c.write("tinyq.yaml", "name: tinyq\nstrategy: fedavg\nmodel: {kind: logistic, inputs: 9}\ndataset: patients\nrounds: 1\n"+
		"cohort: {silos: [h1, h2, h5]}\nprivacy: {clip: 5.0, sigma: 0.5, q: 1.0e-6}\nstandardize: local\n")
	tiny := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "tinyq.yaml"))
	tinyOut, tinyErr, tinyExit := c.cli("alice", "--json", "fl", "watch", tiny[7:19])
	end := finalRecord(t, tinyOut)
	if end.State == "done" || end.State == "running" || tinyExit == nil {
		t.Fatalf("a silo-level run with q = 1e-6 went on, or fl watch exited 0 (%v):\n%s%s", tinyExit, tinyOut, tinyErr)
	}
	declined := map[string]bool{}
	for _, d := range end.Diagnostics {
		if d.Code == "SC9105" {
			declined[d.Subject] = true
		}
	}
	if len(declined) != 3 {
		t.Fatalf("the final record does not carry each silo's SC9105:\n%s", tinyOut)
	}
	// Each silo's own signed record says it declined with SC9105 (the
	// diagnostic's text, naming privacy.q, stays in the silo's log:
	// silo/policy_test.go checks it).
	refused := map[string]bool{}
	for _, rec := range c.account(tiny).Records {
		if rec.Status == silo.Declined && slices.ContainsFunc(rec.Refusals, func(r silo.Refusal) bool { return r.Code == diag.FLBadPrivacy }) {
			refused[rec.Silo] = true
		}
	}
	if !refused["h1"] || !refused["h2"] || !refused["h5"] || len(refused) != 3 {
		t.Fatalf("silos whose records decline q = 1e-6 with SC9105: %v, want h1, h2 and h5", refused)
	}
	out = mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("h1", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 3 {
		t.Fatalf("the refused run was charged: h1's ledger has %d charges, want 3:\n%s", n, out)
	}
	// A run over two sites is refused: each could learn the other's update.
	c.write("two.yaml", "name: two\nstrategy: fedavg\nmodel: {kind: logistic, inputs: 9}\ndataset: patients\nrounds: 1\ncohort: {silos: [h1, h2]}\nprivacy: {clip: 5.0, sigma: 0.5}\nstandardize: local\n")
	if out, errs, err := c.cli("alice", "fl", "launch", "two.yaml"); err == nil || !strings.Contains(errs, "SC9301") {
		t.Fatalf("a two-site run was not refused with SC9301: %v\n%s%s", err, out, errs)
	}
	c.mustCLI("alice", "fl", "model", id, "--out", "model.json")
	if b, err := os.ReadFile(filepath.Join(c.dir, "model.json")); err != nil || !strings.Contains(string(b), `"receipts"`) || !strings.Contains(string(b), `"epsilon_sum"`) {
		t.Fatalf("model export: %v\n%s", err, b)
	}
	// The run spec names no label; every silo declares its own (outcome),
	// and its records say so: the model file records it, and model eval
	// needs no --label.
	var mf struct{ Label string }
	readJSON(t, filepath.Join(c.dir, "model.json"), &mf)
	if mf.Label != "outcome" {
		t.Fatalf("the model file's label is %q, want the silos' outcome", mf.Label)
	}
	if out := mustRun(t, scellisCmd(t, c.dir, "model", "eval", "model.json", "--data", "data/hospital-1.csv")); !strings.Contains(out, "accuracy") {
		t.Fatalf("model eval without --label:\n%s", out)
	}
	// Round 2 is retried (h3's refusal leaves too few sites for the
	// threshold): fl watch and privacy report tell one account.
	watchAgreesWithReport(t, c, id)
	checkPrivacyReportAndAudit(t, c, id)
}

// FedAvg across four silo processes (own regime, DP off, secure aggregation
// on) on hospitals whose patients differ (mean age 38 to 70): with the
// federation's feature statistics (the default) it reaches the held-out
// accuracy of centralised training on the union of the sites, and beats
// every silo standardising with its own statistics. The exported model
// file, scored by `scellis model eval` on the same held-out rows, gives
// exactly the accuracy the federated evaluation of the final step reported.
func TestFLFedAvgMatchesCentralised(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"h1", "h2", "h3", "h4"}
	ms := siloMembers(silos)
	c := newCluster(t, "own", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "750", "--seed", "5", "--out", "data"))
	var trains, tests []*model.Dataset
	for i, s := range silos {
		d, err := model.LoadCSV(filepath.Join(c.dir, "data", fmt.Sprintf("hospital-%d.csv", i+1)), "outcome")
		if err != nil {
			t.Fatal(err)
		}
		train, test, err := model.Split(d, 0.2, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		trains, tests = append(trains, train), append(tests, test)
		writeCSV(t, filepath.Join(c.dir, "data", s+"-train.csv"), train)
		writeCSV(t, filepath.Join(c.dir, "data", s+"-test.csv"), test)
		c.writeSilo(siloConfig{name: s, datasets: []siloDataset{
			{name: "patients", path: "data/" + s + "-train.csv", epsilon: 1},
			{name: "patients-test", path: "data/" + s + "-test.csv", epsilon: 1},
		}})
	}
	// The local run also asks for SecAgg+ masking: its rounds of four
	// mask every pair (too few sites for a sparse graph), and a silo
	// declines a round whose params do not carry the protocol its run
	// asks for, so the run completing shows the choice reaching the silos
	// through the round bundle.
	run := func(name, std, extra string) string {
		return fmt.Sprintf(`name: %s
strategy: {use: fedavg, params: {lr: 0.5, epochs: 2}}
model:
  kind: logistic
  inputs: 9
  features: [age, sex, bmi, systolic_bp, glucose, cholesterol, smoker, exercise_hours, prior_admissions]
  label: outcome
dataset: patients
evaluation: {dataset: patients-test}
standardize: %s
rounds: 12
privacy: {dp: false}
secure_aggregation: true
seed: 1
%s`, name, std, extra)
	}
	c.write("federated.yaml", run("fedavg-federated", "federated", ""))
	c.write("local.yaml", run("fedavg-local", "local", "masking: secagg+\n"))
	if out := mustRun(t, scellisCmd(t, c.dir, "config", "check", "local.yaml")); !strings.Contains(out, "secure aggregation (masking, secagg+)") {
		t.Fatalf("config check does not show the masking protocol:\n%s", out)
	}
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	heldOut := func(file string) (string, fl.RoundSummary) {
		id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", file))
		out, errs, err := c.cli("alice", "--json", "fl", "watch", id)
		if err != nil {
			t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
		}
		finalRecord(t, out)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.Contains(l, `"final":`) { // the watch's closing record
				lines = append(lines, l)
			}
		}
		var first, last fl.RoundSummary
		json.Unmarshal([]byte(lines[0]), &first)
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatalf("last step: %v\n%s", err, out)
		}
		if last.Step != fl.StepEval || last.EvalRows != 600 || len(last.Participants) != 4 {
			t.Fatalf("%s: the last step is not a held-out evaluation of 600 rows by 4 silos:\n%s", file, out)
		}
		if file == "federated.yaml" && (first.Step != fl.StepStats || len(lines) != 14) {
			t.Fatalf("the federated run does not start with its statistics step or has %d steps:\n%s", len(lines), out)
		}
		return id, last
	}
	fedID, fed := heldOut("federated.yaml")
	_, local := heldOut("local.yaml")

	// Centralised: the same model on the union of the training rows,
	// standardised with the union's statistics, scored on the union of
	// the held-out rows.
	all, allTest := trains[0], tests[0]
	for i := 1; i < len(trains); i++ {
		all, allTest = concatRows(all, trains[i]), concatRows(allTest, tests[i])
	}
	std := model.FitStandardizer(all)
	m, _ := model.New(model.Spec{Kind: "logistic", Inputs: 9}, 1)
	m.Std = &std
	if _, err := model.Train(m, all, model.TrainConfig{Epochs: 24, LR: 0.5, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	central := model.Evaluate(m, allTest).Accuracy
	t.Logf("held-out accuracy: federated statistics %.4f, local statistics %.4f, centralised %.4f", fed.EvalAcc, local.EvalAcc, central)
	if fed.EvalAcc < central-0.02 {
		t.Fatalf("federated accuracy %.4f is more than 2 points below centralised %.4f", fed.EvalAcc, central)
	}
	if fed.EvalAcc < local.EvalAcc+0.02 {
		t.Fatalf("federated statistics (%.4f) are not clearly better than local standardisation (%.4f)", fed.EvalAcc, local.EvalAcc)
	}

	// The exported model, scored on the same rows by model eval.
	c.mustCLI("alice", "fl", "model", fedID, "--out", "model.json")
	writeCSV(t, filepath.Join(c.dir, "test.csv"), allTest)
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "model", "eval", "model.json", "--data", "test.csv"))
	var ev struct {
		Rows     int
		Accuracy float64
	}
	if err := json.Unmarshal([]byte(out), &ev); err != nil {
		t.Fatalf("model eval: %v\n%s", err, out)
	}
	if ev.Rows != 600 || math.Abs(ev.Accuracy-fed.EvalAcc) > 1e-9 {
		t.Fatalf("model eval accuracy %.6f on %d rows; the federated evaluation of the final model said %.6f", ev.Accuracy, ev.Rows, fed.EvalAcc)
	}
	// fl simulate over the same four sites (named as the silos, so their
	// seeds are the silos'), in one process, makes the same model.
	for i, s := range silos {
		writeCSV(t, filepath.Join(c.dir, "sim", "train", s+".csv"), trains[i])
		writeCSV(t, filepath.Join(c.dir, "sim", "test", s+".csv"), tests[i])
	}
	simOut := mustRun(t, scellisCmd(t, c.dir, "fl", "simulate", "federated.yaml", "--data", filepath.Join("sim", "train"),
		"--eval-data", filepath.Join("sim", "test"), "--out", "sim-model.json"))
	sim, err := fl.ReadModelFile(filepath.Join(c.dir, "sim-model.json"))
	if err != nil {
		t.Fatal(err)
	}
	mf, err := fl.ReadModelFile(filepath.Join(c.dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for j := range mf.Params {
		worst = max(worst, math.Abs(sim.Params[j]-mf.Params[j]))
	}
	t.Logf("fl simulate vs the live run: largest parameter difference %.3g", worst)
	if worst > 1e-6 || len(sim.Rounds) != len(mf.Rounds) {
		t.Fatalf("fl simulate's model differs from the live run's by %.3g (%d vs %d steps):\n%s", worst, len(sim.Rounds), len(mf.Rounds), simOut)
	}
	mf, err = fl.ReadModelFile(filepath.Join(c.dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	if mf.Standardization.Mode != fl.StandardizeFederated || mf.Standardization.Rows != 2400 || len(mf.Rounds) != 14 || mf.Features[0] != "age" {
		t.Fatalf("model file: standardisation %+v, %d rounds, features %v", mf.Standardization, len(mf.Rounds), mf.Features)
	}
	// The federation's statistics are those of the union of the training rows.
	for j := range std.Mean {
		if math.Abs(mf.Standardization.Mean[j]-std.Mean[j]) > 1e-6*math.Max(1, math.Abs(std.Mean[j])) ||
			math.Abs(mf.Standardization.Std[j]-std.Std[j]) > 1e-6*math.Max(1, std.Std[j]) {
			t.Fatalf("feature %d: federated mean/std %g/%g, pooled %g/%g", j, mf.Standardization.Mean[j], mf.Standardization.Std[j], std.Mean[j], std.Std[j])
		}
	}
}

func writeCSV(t testing.TB, path string, d *model.Dataset) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := model.WriteCSV(&buf, d); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func concatRows(a, b *model.Dataset) *model.Dataset {
	var buf bytes.Buffer
	model.WriteCSV(&buf, a)
	var tail bytes.Buffer
	model.WriteCSV(&tail, b)
	rows := strings.SplitN(tail.String(), "\n", 2)
	buf.WriteString(rows[1])
	d, err := model.ParseCSV(&buf, "pooled", a.Label)
	if err != nil {
		panic(err)
	}
	return d
}

// runEndRecord is the final record of `fl watch --json`.
type runEndRecord struct {
	Final       bool
	State       string
	Reason      string
	Diagnostics []struct{ Code, Subject, Message string }
}

func finalRecord(t *testing.T, out string) runEndRecord {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var end runEndRecord
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &end); err != nil || !end.Final {
		t.Fatalf("fl watch --json does not end with a final record (%v):\n%s", err, out)
	}
	return end
}

// checkFLManagement drives the run-management commands against a finished
// run: ls, status by the 12-digit prefix, a relaunch, the final record of
// watch, and prefixes that name no run.
func checkFLManagement(t *testing.T, c *cluster, id string) {
	short := id[len("sha256:") : len("sha256:")+12]
	if out := c.mustCLI("alice", "fl", "ls"); !strings.Contains(out, short) || !strings.Contains(out, "done") || !strings.Contains(out, "3/3") {
		t.Fatalf("fl ls does not list the finished run %s:\n%s", short, out)
	}
	out := c.mustCLI("alice", "fl", "status", short)
	if !strings.Contains(out, "state done; 3 of 3 rounds done") || !strings.Contains(out, "linearizable") {
		t.Fatalf("fl status %s:\n%s", short, out)
	}
	// The start time is the launch's (it printed 1970-01-01: StartRun's
	// time was dropped with the plan's).
	m := regexp.MustCompile(`started (\S+), ended (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("fl status names no start and end time:\n%s", out)
	}
	started, err1 := time.Parse(time.RFC3339, strings.TrimSuffix(m[1], ","))
	ended, err2 := time.Parse(time.RFC3339, m[2])
	if err1 != nil || err2 != nil || time.Since(started) > time.Hour || started.After(ended) || ended.After(time.Now().Add(time.Minute)) {
		t.Fatalf("fl status: started %s, ended %s (%v %v), want both within this test:\n%s", m[1], m[2], err1, err2, out)
	}
	out, errs, err := c.cli("alice", "fl", "launch", "run.yaml")
	if err != nil || strings.TrimSpace(out) != id || !strings.Contains(errs, "already launched and is done: 3 of 3 rounds done; nothing changed") {
		t.Fatalf("relaunching a finished run (%v):\n%s%s", err, out, errs)
	}
	out, errs, err = c.cli("alice", "--json", "fl", "watch", short)
	if end := finalRecord(t, out); err != nil || end.State != "done" {
		t.Fatalf("fl watch --json of a done run (%v):\n%s%s", err, out, errs)
	}
	for _, bad := range []string{"000000", "zz"} {
		if _, errs, err := c.cli("alice", "fl", "status", bad); err == nil || !strings.Contains(errs, "SC9302") && !strings.Contains(errs, "SC1005") {
			t.Fatalf("fl status %s (%v):\n%s", bad, err, errs)
		}
	}
}

// Systems heterogeneity through the live path: ten silo processes hold
// FedProx's Synthetic(1,1) devices, and every training round 90% of them
// are stragglers that may do only part of their local work
// (cohort.stragglers). FedAvg drops a straggler's update; FedProx (μ = 1)
// keeps its partial work, and ends with the better held-out accuracy
// (Li et al. 2020, §5.2). DP off, so both runs are deterministic.
func TestFLFedProxBeatsFedAvgWithStragglers(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	var silos []string
	var ms []member
	for i := 1; i <= 10; i++ {
		s := fmt.Sprintf("d%02d", i)
		silos = append(silos, s)
		ms = append(ms, member{s, "silo"})
	}
	c := newCluster(t, "own", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "synthetic", "--alpha", "1", "--beta", "1", "--devices", "10", "--seed", "1", "--out", "data"))
	for i, s := range silos {
		c.writeSilo(siloConfig{name: s, datasets: []siloDataset{{name: "devices", path: fmt.Sprintf("data/device-%02d.csv", i+1), label: "y", epsilon: 1}}})
	}
	run := func(name, strategy string) string {
		return fmt.Sprintf(`name: %s
strategy: {use: %s}
model: {kind: softmax, inputs: 60, classes: 10, label: y}
dataset: devices
evaluation: {holdout: 0.2}
cohort: {stragglers: 0.9}
rounds: 12
privacy: {dp: false}
seed: 1
`, name, strategy)
	}
	c.write("fedavg.yaml", run("stragglers-fedavg", "fedavg, params: {lr: 0.01, epochs: 20, batch_size: 10}"))
	c.write("fedprox.yaml", run("stragglers-fedprox", "fedprox, params: {mu: 1, lr: 0.01, epochs: 20, batch_size: 10}"))
	// FedBuff on the same silos (lean: 3 server steps of 3 silos, 2
	// epochs): buffered-asynchronous, each silo training from the version
	// it last fetched and scaling its own update by its staleness.
	c.write("fedbuff.yaml", `name: buffered-fedbuff
strategy: {use: fedbuff, params: {lr: 0.01, epochs: 2, batch_size: 10}}
model: {kind: softmax, inputs: 60, classes: 10, label: y}
dataset: devices
cohort: {buffer: 3}
rounds: 3
privacy: {dp: false}
seed: 2
`)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	ids := map[string]string{}
	for _, f := range []string{"fedavg.yaml", "fedprox.yaml"} {
		ids[f] = strings.TrimSpace(c.mustCLI("alice", "fl", "launch", f))
	}
	buffered := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "fedbuff.yaml"))
	final := map[string]fl.RoundSummary{}
	for f, id := range ids {
		out, errs, err := c.cli("alice", "--json", "fl", "watch", id)
		if err != nil {
			t.Fatalf("fl watch %s: %v\n%s%s", f, err, out, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var last, straggled fl.RoundSummary
		json.Unmarshal([]byte(lines[len(lines)-2]), &last)
		json.Unmarshal([]byte(lines[3]), &straggled)
		if last.Step != fl.StepEval || len(last.Participants) != 10 {
			t.Fatalf("%s: no final evaluation by the ten silos:\n%s", f, out)
		}
		if f == "fedavg.yaml" && len(straggled.Participants) != 10 {
			// FedAvg's stragglers send zeros with weight 0: they still
			// take part in secure aggregation.
			t.Fatalf("%s: round 3 had %d participants:\n%s", f, len(straggled.Participants), out)
		}
		final[f] = last
	}
	checkFedBuff(t, c, buffered)
	avg, prox := final["fedavg.yaml"].EvalAcc, final["fedprox.yaml"].EvalAcc
	t.Logf("held-out accuracy with 90%% stragglers: FedAvg %.4f, FedProx (μ = 1) %.4f", avg, prox)
	if prox <= avg {
		t.Fatalf("FedProx (%.4f) does not beat FedAvg (%.4f) on held-out accuracy with 90%% stragglers", prox, avg)
	}
}

// DiLoCo through the silo appliance: three silo processes run its inner
// AdamW with their moments kept across rounds in each silo's persisted
// client state, the aggregator its outer Nesterov step on the sum; the
// held-out accuracy of the final model beats predicting the majority class.
func TestFLDiLoCoThroughSilos(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"h1", "h2", "h3"}
	ms := siloMembers(silos)
	c := newCluster(t, "own", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "3", "--rows", "300", "--seed", "8", "--out", "data"))
	var rows, positives float64
	for i, s := range silos {
		cfg := hospitalSilo(s, i+1, 1, "")
		cfg.policy = "  strategies: [diloco]\n"
		c.writeSilo(cfg)
		d, err := model.LoadCSV(filepath.Join(c.dir, "data", fmt.Sprintf("hospital-%d.csv", i+1)), "outcome")
		if err != nil {
			t.Fatal(err)
		}
		for _, y := range d.Y {
			rows, positives = rows+1, positives+y
		}
	}
	majority := max(positives, rows-positives) / rows
	c.write("run.yaml", `name: diloco
strategy: {use: diloco, params: {steps: 20, lr: 0.05}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
evaluation: {holdout: 0.25}
rounds: 5
privacy: {dp: false}
seed: 2
`)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	out, errs, err := c.cli("alice", "--json", "fl", "watch", id)
	if err != nil {
		t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last fl.RoundSummary
	json.Unmarshal([]byte(lines[len(lines)-2]), &last)
	t.Logf("DiLoCo held-out accuracy %.4f, majority class %.4f", last.EvalAcc, majority)
	if last.Step != fl.StepEval || len(last.Participants) != 3 || last.EvalAcc <= majority {
		t.Fatalf("DiLoCo's final model (held-out accuracy %.4f) does not beat the majority class (%.4f):\n%s", last.EvalAcc, majority, out)
	}
	for _, s := range silos { // each silo kept its inner optimizer's state
		if m, _ := filepath.Glob(filepath.Join(c.dir, s, "data", "*", "state")); len(m) != 1 {
			t.Fatalf("%s holds %d client state files, want 1", s, len(m))
		}
	}
}

// The README's federated walkthrough, verbatim: four silos configured from
// its hospital-a.yaml (only the name, the dataset path and the data folder
// changed), a consortium, its run.yaml as it is (record-level DP-SGD,
// federated statistics, held-out evaluation), then fl model and model
// eval: the model beats predicting the majority class on the sites' rows.
func TestREADMEFederatedWalkthrough(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"hospital-a", "hospital-b", "hospital-c", "hospital-d"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "800", "--seed", "11", "--out", "data"))
	var all *model.Dataset
	for i, s := range silos {
		c.write(s+".yaml", readmeSilo(t, s, i+1))
		d, err := model.LoadCSV(filepath.Join(c.dir, "data", fmt.Sprintf("hospital-%d.csv", i+1)), "outcome")
		if err != nil {
			t.Fatal(err)
		}
		if all == nil {
			all = d
		} else {
			all = concatRows(all, d)
		}
	}
	c.write("run.yaml", readmeBlock(t, "run.yaml"))
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	if out, errs, err := c.cli("alice", "fl", "watch", id); err != nil {
		t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
	} else {
		t.Logf("fl watch:\n%s", out)
	}
	c.mustCLI("alice", "fl", "model", id, "--out", "model.json")
	writeCSV(t, filepath.Join(c.dir, "all.csv"), all)
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "model", "eval", "model.json", "--data", "all.csv"))
	var ev struct{ Accuracy float64 }
	if err := json.Unmarshal([]byte(out), &ev); err != nil {
		t.Fatal(err)
	}
	var pos float64
	for _, y := range all.Y {
		pos += y
	}
	majority := max(pos, float64(all.Rows())-pos) / float64(all.Rows())
	t.Logf("the README's run: accuracy %.4f on the sites' %d rows, majority class %.4f", ev.Accuracy, all.Rows(), majority)
	if ev.Accuracy <= majority {
		t.Fatalf("the README's run (accuracy %.4f) does not beat the majority class (%.4f)", ev.Accuracy, majority)
	}
}

// readmeBlock is the README's yaml block that starts with the comment
// "# name".
func readmeBlock(t testing.TB, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(# " + regexp.QuoteMeta(name) + "[ \n].*?)```").FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatalf("README.md has no yaml block # %s", name)
	}
	return m[1]
}

// readmeSilo is the README's hospital-a.yaml for silo name with site i's
// rows (data/hospital-i.csv, as datagen writes them): only the name, the
// dataset path and the data folder changed.
func readmeSilo(t testing.TB, name string, i int) string {
	y := strings.ReplaceAll(readmeBlock(t, "hospital-a.yaml"), "hospital-a", name)
	y = regexp.MustCompile(`(?m)^(data_dir:\s*)\S+`).ReplaceAllString(y, "${1}"+name+"/data")
	return regexp.MustCompile(`(?m)^(\s*path:\s*)\S+`).ReplaceAllString(y, fmt.Sprintf("${1}data/hospital-%d.csv", i))
}

// checkFedBuff checks a finished buffered-asynchronous run (cohort.buffer
// 3 of ten silos, 3 server steps): every step sums exactly three silos'
// updates through secure aggregation, and a silo that sat out a step
// trains the next time from the version it last fetched, with its
// staleness in the round's result (the first step has none; at the
// third a silo drawn for the first time is 2 versions stale).
func checkFedBuff(t *testing.T, c *cluster, id string) {
	t.Helper()
	out, errs, err := c.cli("alice", "--json", "fl", "watch", id)
	if err != nil {
		t.Fatalf("fl watch of the FedBuff run: %v\n%s%s", err, out, errs)
	}
	var steps, stale int
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var row fl.RoundSummary
		if json.Unmarshal([]byte(line), &row) != nil || row.Step != fl.StepTrain {
			continue
		}
		if len(row.Participants) != 3 {
			t.Fatalf("FedBuff step %d summed %v, want a buffer of 3:\n%s", row.Round, row.Participants, out)
		}
		if steps == 0 && len(row.Staleness) != 0 {
			t.Fatalf("FedBuff's first step has stale silos %v", row.Staleness)
		}
		for s, tau := range row.Staleness {
			if !slices.Contains(row.Participants, s) || tau < 1 || tau > steps {
				t.Fatalf("FedBuff step %d: staleness %v for participants %v", row.Round, row.Staleness, row.Participants)
			}
			stale++
		}
		steps++
	}
	if steps != 3 || stale == 0 {
		t.Fatalf("FedBuff: %d server steps, %d stale updates (want 3 steps, some stale):\n%s", steps, stale, out)
	}
	t.Logf("FedBuff through the silos: %d stale updates in 3 buffered steps", stale)
}
