package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/silo"
)

// A run with aggregation: threshold-he through real processes (one
// aggregator, six silos): its two rounds are summed by threshold
// homomorphic encryption on the aggregator's /secagg-he/ host, under
// update-level DP; s4's policy allows masking only, so it declines each
// round (SC9211) and the three others carry the sum (t = 3). A second
// run over s1, s2 and s4 is left with two sites: refused, nothing summed.
// Then dropouts after encryption: d1 and d2 are silos started with the
// test fault kill-after-he-ciphertext (package testfault): each kills
// itself (SIGKILL) the moment the aggregator accepted its ciphertext, so
// it is summed but never decrypts. A run over d1, s1, s2 and s3 (t = 3;
// d1 sorts first, so it is among the first decryptors and must be
// replaced) completes with the sum of all four; one over d2, s1, s2 and
// s4 (s4 declines) is left with two decryptors, below t: SC6004, the round
// is retried without d2 and the run stops as it would under masking.
// Once the binary is built it takes ~10 s on two cores (~4 s before the
// dropout runs were added: they need two more silo processes and two
// more runs, one of them retried): one cluster serves all four runs, the
// least that drives the mode and its dropouts through the binary.
func TestFLThresholdHERun(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"s1", "s2", "s3", "s4", "d1", "d2"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	fault := []string{testfault.Env + "=" + testfault.KillAfterHECiphertext}
	c.env = map[string][]string{"d1": fault, "d2": fault}
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "6", "--rows", "150", "--out", "data"))
	for i, s := range silos {
		modes := ""
		if s == "s4" {
			modes = "  aggregation: [masking]\n"
		}
		cfg := hospitalSilo(s, i+1, 50, "silo")
		cfg.policy = modes + "  min_cohort: 3\n"
		c.writeSilo(cfg)
	}
	// Every run names its cohort: d1 and d2 take part only in the runs
	// they are meant to die in.
	spec := func(file string, rounds int, cohort ...string) {
		c.write(file, fmt.Sprintf(`name: %s
strategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: %d
cohort: {silos: [%s]}
privacy: {clip: 5.0, sigma: 0.5}
standardize: local
secure_aggregation: true
aggregation: threshold-he
seed: 5
`, strings.TrimSuffix(file, ".yaml"), rounds, strings.Join(cohort, ", ")))
	}
	spec("run.yaml", 2, "s1", "s2", "s3", "s4")
	if out := mustRun(t, scellisCmd(t, c.dir, "config", "check", "run.yaml")); !strings.Contains(out, "secure aggregation (threshold-he)") {
		t.Fatalf("config check does not show the mode:\n%s", out)
	}
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	table, errs, err := c.cli("alice", "fl", "watch", id)
	if err != nil || !strings.Contains(table, "run done") {
		t.Fatalf("the threshold-he run did not complete (%v):\n%s%s", err, table, errs)
	}
	for r := range 2 {
		if !strings.Contains(table, fmt.Sprintf("\n%5d  train %-5d ", r, 3)) {
			t.Fatalf("round %d did not have 3 participants:\n%s", r, table)
		}
	}
	if !strings.Contains(table, "s4 declined: SC9211") {
		t.Fatalf("s4's refusal of threshold-he is not shown:\n%s", table)
	}
	// s1 is in both rounds' sums (the run's record, not its log's
	// wording: a retried round is worded otherwise); s4's SC9211 above
	// shows the mode reached the silos.
	for _, r := range c.rounds(id) {
		if !slices.Contains(r.Participants, "s1") {
			t.Fatalf("round %d summed %v, without s1", r.Round, r.Participants)
		}
	}
	// Each contributing silo paid for each round before its ciphertext left.
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("s1", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 2 {
		t.Fatalf("s1's ledger has %d charges, want 2:\n%s", n, out)
	}
	if out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("s4", "data", "privacy.ledger"))); strings.Contains(out, `"consumer"`) {
		t.Fatalf("s4 declined every round but its ledger was charged:\n%s", out)
	}

	heDefaultStandardize(t, c)

	// Below the three-site minimum: s4 refuses the mode, two are left; the
	// round ends at advertising (SC6002) and the run stops. (s1 and s2 paid
	// before sending, as law 6 wants: nothing had left when it ended.)
	spec("few.yaml", 1, "s1", "s2", "s4")
	few := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "few.yaml"))
	fewOut, fewErr, fewExit := c.cli("alice", "--json", "fl", "watch", few[7:19])
	end := finalRecord(t, fewOut)
	if end.State == "done" || end.State == "running" || fewExit == nil {
		t.Fatalf("a threshold-he run left with two sites went on (%v):\n%s%s", fewExit, fewOut, fewErr)
	}
	var refused bool
	for _, d := range end.Diagnostics {
		refused = refused || (d.Code == "SC9211" && d.Subject == "s4")
	}
	if !refused {
		t.Fatalf("the final record does not carry s4's SC9211:\n%s", fewOut)
	}

	heDropouts(t, c, spec)
}

// heDefaultStandardize runs threshold-he with the default standardize:
// federated and a final evaluation, under DP (issue 30: the statistics
// and evaluation steps' range did not fit the HE ring on their DP grid,
// and such a run failed at step 0 while config check called it valid).
// Every step is summed by threshold-he and the model file carries the
// federation's statistics.
func heDefaultStandardize(t *testing.T, c *cluster) {
	c.write("std.yaml", `name: std
strategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 1
cohort: {silos: [s1, s2, s3]}
privacy: {clip: 5.0, sigma: 0.5, sums_sigma: 8, feature_bounds: [[0, 120], [0, 1], [10, 80], [50, 300], [20, 600], [50, 500], [0, 1], [0, 40], [0, 20]]}
evaluation: {holdout: 0.2}
aggregation: threshold-he
seed: 5
`)
	mustRun(t, scellisCmd(t, c.dir, "config", "check", "std.yaml"))
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "std.yaml"))
	table, errs, err := c.cli("alice", "fl", "watch", id)
	if err != nil || !strings.Contains(table, "run done") {
		t.Fatalf("threshold-he with federated statistics did not complete (%v):\n%s%s", err, table, errs)
	}
	for _, step := range []string{"\n    0  stats 3 ", "\n    1  train 3 ", "\n    2  eval  3 "} {
		if !strings.Contains(table, step) {
			t.Fatalf("no step %q of three silos:\n%s", step, table)
		}
	}
	steps := map[int]bool{}
	for _, rec := range c.account(id).Records {
		if rec.Silo == "s2" && rec.Status == silo.Contributed {
			steps[rec.Round] = true
		}
	}
	if len(steps) != 3 {
		t.Fatalf("s2 contributed to steps %v of the threshold-he run, want all three", steps)
	}
	c.mustCLI("alice", "fl", "model", id, "--out", "std-model.json")
	var f fl.ModelFile
	if err := json.Unmarshal([]byte(readFile(t, c.dir, "std-model.json")), &f); err != nil {
		t.Fatal(err)
	}
	st := f.Standardization
	if st.Mode != fl.StandardizeFederated || len(st.Mean) != 9 || len(st.Std) != 9 || !(st.Rows >= 1) {
		t.Fatalf("the model's standardisation: %+v", st)
	}
	for j := range 9 {
		if math.IsNaN(st.Mean[j]) || !(st.Std[j] > 0) {
			t.Fatalf("feature %d: mean %v std %v", j, st.Mean[j], st.Std[j])
		}
	}
}

// heDropouts runs TestFLThresholdHERun's two dropout runs (see there).
func heDropouts(t *testing.T, c *cluster, spec func(string, int, ...string)) {
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	cl := c.apiClient("alice")

	// d1 dies after encrypting; s1, s2 and s3 are enough to decrypt.
	spec("drop.yaml", 1, "d1", "s1", "s2", "s3")
	drop := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "drop.yaml"))
	if out, errs, err := c.cli("alice", "fl", "watch", drop); err != nil || !strings.Contains(out, "run done") {
		t.Fatalf("the run with a dropout after encryption did not complete (%v):\n%s%s", err, out, errs)
	}
	c.waitExit("d1")
	if sig := c.exitSignal("d1"); sig != syscall.SIGKILL {
		t.Fatalf("d1 ended by signal %v, not by its fault's SIGKILL (%s)", sig, testfault.KillAfterHECiphertext)
	}
	st := c.run(drop)
	rows := c.rounds(drop)
	if len(rows) != 1 || !slices.Equal(rows[0].Participants, []string{"d1", "s1", "s2", "s3"}) || len(rows[0].Dropped) != 0 {
		t.Fatalf("the dead d1's ciphertext is not in the sum: %+v", rows)
	}
	// Under DP each site's weight is exactly 1 on the grid: the decrypted
	// total weight is the number of ciphertexts summed, d1's included.
	raw, err := cl.GetBlob(ctx, ref(t, st.Models[0]))
	if err != nil {
		t.Fatal(err)
	}
	rr, _, err := fl.DecodeRoundResult(raw)
	if err != nil || rr.Weight != 4 {
		t.Fatalf("the decrypted weight is %v, want exactly 4 (%v)", rr.Weight, err)
	}
	// d1 paid before its ciphertext left, and never reported: its shard
	// of the round job is flagged unverified, the three others verified.
	js, err := cl.Job(ctx, ref(t, st.Jobs[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range js.Shards {
		want := coordinator.StateVerified
		if sh.Peer == "d1" {
			want = coordinator.StateUnverified
		}
		if sh.State != want {
			t.Errorf("%s's shard of the round is %s, want %s", sh.Peer, sh.State, want)
		}
	}
	if n := len(checkLedger(t, c, "d1")); n != 1 {
		t.Errorf("d1's ledger holds %d charges, want 1 (the round it died in)", n)
	}

	// d2 dies after encrypting, s4 declines: s1 and s2 cannot decrypt
	// with t = 3. The attempt fails with SC6004; its retry would leave out
	// d2 (gone) and s4 (it declined this round, and would again), which
	// leaves too few: s4's policy makes progress impossible and the run
	// stops, naming its refusal.
	spec("below.yaml", 1, "d2", "s1", "s2", "s4")
	below := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "below.yaml"))
	out, errs, err := c.cli("alice", "--json", "fl", "watch", below)
	if end := finalRecord(t, out); err == nil || end.State != "stopped" {
		t.Fatalf("a round below t went on (%v):\n%s%s", err, out, errs)
	}
	c.waitExit("d2")
	if st := c.run(below); len(st.Jobs) < 1 || len(st.Models) != 0 || !strings.Contains(st.Reason, "s4 SC9211") {
		t.Fatalf("the round that failed below t did not stop on s4's decline: %+v", st)
	}
	var failedBelow bool
	for _, rec := range c.account(below).Records {
		if rec.Silo == "s1" && rec.Status == silo.Failed && slices.ContainsFunc(rec.Refusals, func(r silo.Refusal) bool { return r.Code == diag.SecAggBelowThreshold }) {
			failedBelow = true
		}
	}
	if !failedBelow {
		t.Fatal("s1 reported no failed record with SC6004 for the round that failed below t")
	}
	if n := len(checkLedger(t, c, "d2")); n != 1 {
		t.Errorf("d2's ledger holds %d charges, want 1 (the round it died in)", n)
	}
}

func ref(t *testing.T, s string) content.Ref {
	t.Helper()
	r, err := content.ParseRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
