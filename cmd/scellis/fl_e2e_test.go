package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A federated run with real processes: one aggregator, four silos, each
// with its own data, ledger and policy. Update-level DP and secure
// aggregation in a consortium; the ledgers show the accountant's ε for every
// round; a silo whose policy refuses the strategy declines.
func TestFLRunWithSilos(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"h1", "h2", "h3", "h4"}
	var ms []member
	for _, s := range silos {
		ms = append(ms, member{s, "silo"})
	}
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "worker"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "300", "--out", "data"))
	for i, s := range silos {
		strategies := ""
		if s == "h4" {
			strategies = "  strategies: [scaffold]\n"
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
`, s, s, s, i+1, strategies))
	}
	c.write("run.yaml", `name: fedavg-hospitals
strategy: {use: fedavg, params: {lr: 0.5, epochs: 2}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 3
privacy: {clip: 5.0, sigma: 0.5}
secure_aggregation: true
seed: 3
`)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	done := make(chan string, 1)
	go func() {
		out, _, _ := c.cli("alice", "fl", "watch", id)
		done <- out
	}()
	var table string
	select {
	case table = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the run did not finish in 3 minutes")
	}
	t.Logf("fl watch:\n%s", table)
	if !strings.Contains(table, "run done") {
		t.Fatalf("run did not complete:\n%s", table)
	}
	for r := 0; r < 3; r++ {
		if !strings.Contains(table, fmt.Sprintf("\n%5d  3 ", r)) {
			t.Fatalf("round %d did not have 3 participants:\n%s", r, table)
		}
	}
	if !strings.Contains(table, "h4 declined: SC9201") {
		t.Fatalf("h4's policy refusal is not shown:\n%s", table)
	}
	// Each participating silo's ledger holds one charge per round and verifies.
	out := mustRun(t, scellisCmd(t, c.dir, "--json", "ledger", "show", "--ledger", filepath.Join("h1", "data", "privacy.ledger")))
	if n := strings.Count(out, `"consumer"`); n != 3 {
		t.Fatalf("h1's ledger has %d charges, want 3:\n%s", n, out)
	}
	mustRun(t, scellisCmd(t, c.dir, "ledger", "verify", "--ledger", filepath.Join("h1", "data", "privacy.ledger")))
	c.mustCLI("alice", "fl", "model", id, "--out", "model.json")
	if b, err := os.ReadFile(filepath.Join(c.dir, "model.json")); err != nil || !strings.Contains(string(b), `"receipts"`) {
		t.Fatalf("model export: %v\n%s", err, b)
	}
}
