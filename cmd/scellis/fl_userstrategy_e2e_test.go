package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
)

// damped is a strategy of a user's own (docs/content.md's example, with a
// count of its server steps in the global state, so the test can tell
// that its server_step, not a built-in's, made the model).
const damped = `"""damped-avg: FedAvg with a damped server step that counts its steps."""

load("fl-common", "client_weight", "evaluate_sum", "initial_params", "local_train", "num")

def init(params, dims):
    return {"w": initial_params(params, dims), "round": 0, "server_steps": 0}

def client_step(g, data, params, state):
    w = g["w"]
    m = local_train(w, data, params)
    n = client_weight(params, data, "examples")  # 1 under DP (the engine says uniform)
    return {"update": (model.params(m) - w) * n, "weight": n,
            "metrics": evaluate_sum(w, data, params), "state": None}

def server_step(g, total, weight, params):
    if weight == 0:
        return g
    step = num(params, "server_lr", 0.5) / weight
    return {"w": g["w"] + total * step, "round": g["round"] + 1, "server_steps": g["server_steps"] + 1}
`

// TestFLUserStrategyFromCatalog: a strategy a researcher wrote, added to
// her catalog with ` + "`scellis catalog add`" + `, drives a live run over the
// network: three aggregator processes (the leader's server steps
// cross-checked by a second node, which fetches the strategy by its ref)
// and four silo processes whose policy accepts that content alone, by
// its sha256 ref. Every round result names the strategy's ref, and the
// final global state holds the count only its server_step keeps.
func TestFLUserStrategyFromCatalog(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	c, silos := fourSiloCluster(t, "")
	c.write("damped-avg.star", damped)
	out := c.mustCLI("alice", "catalog", "add", "damped-avg.star")
	stratRef := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(out)
	if stratRef == "" {
		t.Fatalf("catalog add printed no ref:\n%s", out)
	}
	if ls := c.mustCLI("alice", "catalog", "ls"); !strings.Contains(ls, "damped-avg") {
		t.Fatalf("catalog ls does not list the added strategy:\n%s", ls)
	}
	c.writeHospitalSilos(silos, fmt.Sprintf("  strategies: [%q]\n  min_cohort: 3\n", stratRef))
	const rounds = 2
	c.write("run.yaml", fmt.Sprintf(`name: user-strategy
strategy: {use: damped-avg, params: {lr: 0.5, epochs: 1, server_lr: 0.8}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: %d
privacy: {clip: 5.0, sigma: 0.5}
standardize: local
secure_aggregation: true
seed: 9
`, rounds))
	c.startAll(silos)
	docs, gs := c.roundResults(t, c.launchDone("run.yaml"))
	if len(docs) != rounds {
		t.Fatalf("%d round results, want %d", len(docs), rounds)
	}
	for r, doc := range docs {
		if string(doc.Strategy) != stratRef || len(doc.Participants) != len(silos) {
			t.Fatalf("round %d: strategy %s, participants %v; want %s from all four silos", r, doc.Strategy, doc.Participants, stratRef)
		}
		if doc.Check == nil || doc.Check.Mode != fl.CrossChecked {
			t.Fatalf("round %d: the user's server step was not cross-checked: %+v", r, doc.Check)
		}
	}
	last := gs[len(gs)-1]
	if n, ok := last["server_steps"].(int64); !ok || n != rounds {
		t.Fatalf("the final global state counts %v (%T) server steps, want %d: the user's server_step did not run", last["server_steps"], last["server_steps"], rounds)
	}
}
