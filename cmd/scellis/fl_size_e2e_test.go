package main

import (
	"fmt"
	"strings"
	"testing"
)

// A model's size is the silos' policy, not the run spec parser's (issue
// 32), through real processes (one aggregator, five silos): a run of an
// MLP with 8,192 hidden units (90,113 parameters, twice the width the
// parser used to cap) is accepted by `scellis config check` and launched;
// s4's policy trains models of at most 50,000 parameters and s5's moves at
// most 1 MB a round, so each declines the round with SC9213, and s1–s3
// carry the sum. `config check` on s4's config states the bound.
func TestFLModelSizePolicy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"s1", "s2", "s3", "s4", "s5"}
	var ms []member
	for _, s := range silos {
		ms = append(ms, member{s, "silo"})
	}
	c := newCluster(t, "consortium", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "5", "--rows", "100", "--out", "data"))
	for i, s := range silos {
		bound := ""
		switch s {
		case "s4":
			bound = "  max_model_params: 50000\n"
		case "s5":
			bound = "  max_round_mb: 1\n"
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
`, s, s, s, i+1, bound))
	}
	if out := mustRun(t, scellisCmd(t, c.dir, "config", "check", "s4.yaml")); !strings.Contains(out, "models of at most 50000 parameters") {
		t.Fatalf("config check does not state s4's bound:\n%s", out)
	}
	c.write("run.yaml", `name: wide
strategy: {use: fedavg, params: {lr: 0.5, steps: 1, batch_size: 16}}
model: {kind: mlp, inputs: 9, hidden: 8192, classes: 2, label: outcome}
dataset: patients
rounds: 1
privacy: {clip: 1.0, sigma: 1.0}
standardize: local
secure_aggregation: true
seed: 3
`)
	mustRun(t, scellisCmd(t, c.dir, "config", "check", "run.yaml"))
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	table, errs, err := c.cli("alice", "fl", "watch", id)
	if err != nil || !strings.Contains(table, "run done") {
		t.Fatalf("the run did not complete (%v):\n%s%s", err, table, errs)
	}
	for _, s := range []string{"s4", "s5"} {
		if !strings.Contains(table, s+" declined: SC9213") {
			t.Fatalf("%s's refusal of the model's size is not shown:\n%s", s, table)
		}
	}
	rounds := c.rounds(id)
	if len(rounds) != 1 || strings.Join(rounds[0].Participants, ",") != "s1,s2,s3" {
		t.Fatalf("the round summed %+v, want s1, s2 and s3", rounds)
	}
}
