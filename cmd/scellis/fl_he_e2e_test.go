package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A run with aggregation: threshold-he through real processes (one
// aggregator, four silos): its two rounds are summed by threshold
// homomorphic encryption on the aggregator's /secagg-he/ host, under
// update-level DP; s4's policy allows masking only, so it declines each
// round (SC9211) and the three others carry the sum (t = 3). A second
// run over s1, s2 and s4 is left with two sites: refused, nothing summed.
// (Dropouts after encryption and rounds below t are exercised over real
// HTTPS by secagg/hewire's TestRoundOverTLS.) It takes ~25 s on two busy
// cores (five processes, 150 rows a silo, two rounds): one cluster serves
// both runs, the least that drives the mode through the binary.
func TestFLThresholdHERun(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"s1", "s2", "s3", "s4"}
	var ms []member
	for _, s := range silos {
		ms = append(ms, member{s, "silo"})
	}
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "150", "--out", "data"))
	for i, s := range silos {
		modes := ""
		if s == "s4" {
			modes = "  aggregation: [masking]\n"
		}
		c.write(s+".yaml", fmt.Sprintf(`name: %s
identity: %s/identity.key
federation: federation.yaml
data_dir: %s/data
datasets:
  - name: patients
    path: data/hospital-%d.csv
    label: outcome
    class: confidential
    budget: {epsilon: 50, delta: 1.0e-5}
    unit: silo
policy:
%s  min_cohort: 3
`, s, s, s, i+1, modes))
	}
	c.write("run.yaml", `name: he-hospitals
strategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 2
privacy: {clip: 5.0, sigma: 0.5}
standardize: local
secure_aggregation: true
aggregation: threshold-he
seed: 5
`)
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
	if log := readFile(t, c.dir, "s1.log"); strings.Count(log, "masking)") > 0 || strings.Count(log, "contributed (secure aggregation round") != 2 ||
		strings.Count(log, "threshold-he)") != 2 {
		t.Fatalf("s1 did not contribute to two threshold-he sums:\n%s", log)
	}
	// Each contributing silo paid for each round before its ciphertext left.
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("s1", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 2 {
		t.Fatalf("s1's ledger has %d charges, want 2:\n%s", n, out)
	}
	if out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("s4", "data", "privacy.ledger"))); strings.Contains(out, `"consumer"`) {
		t.Fatalf("s4 declined every round but its ledger was charged:\n%s", out)
	}

	// Below the three-site minimum: s4 refuses the mode, two are left; the
	// round ends at advertising (SC6002) and the run stops. (s1 and s2 paid
	// before sending, as law 6 wants: nothing had left when it ended.)
	c.write("few.yaml", strings.Replace(strings.Replace(readFile(t, c.dir, "run.yaml"), "rounds: 2", "rounds: 1\ncohort: {silos: [s1, s2, s4]}", 1), "he-hospitals", "he-few", 1))
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
}
