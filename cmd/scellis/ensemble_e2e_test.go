package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPoolEnsemble runs examples/ensemble's program through a pool — one
// aggregator, two workers, each a process — cut to three members and a
// single model over a few epochs: k models trained on k shards of the
// training rows, combined by the built-in ensemble reducer, scored on the
// held-out rows against one model trained on all of them. The pool's
// result.json must equal a solo run's (the replayable tier), and the
// scores must be what an ensemble gives: the averaged probabilities' log
// loss is never above the members' mean (log loss is convex).
func TestPoolEnsemble(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "consortium", 1, member{"w1", "worker"}, member{"w2", "worker"}, member{"alice", "researcher"})
	for from, to := range map[string]string{
		filepath.Join("..", "..", "examples", "ensemble", "members.star"): "members.star",
		filepath.Join("..", "..", "examples", "data", "hospital-2.csv"):   "hospital.csv",
	} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		c.write(to, string(b))
	}
	c.write("ensemble.yaml", `name: ensemble-small
program: ./members.star
partitioner:
  use: items
  params:
    items: [{member: 0}, {member: 1}, {member: 2}, {single: true}]
reducer: ensemble
params: {k: 3, model: mlp, hidden: 4, epochs: 3, batch_size: 32, lr: 0.05, test_frac: 0.25, seed: 3}
inputs:
  data: {path: hospital.csv, label: outcome, class: confidential}
`)
	mustRun(t, scellisCmd(t, c.dir, "run", "ensemble.yaml", "--out", "solo"))
	c.startAggregators()
	c.startWorker("w1")
	c.startWorker("w2")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", "ensemble.yaml"))
	waitFor(t, "the ensemble job to complete", 3*time.Minute, func() bool { return c.status("alice", id).State == "done" })
	c.mustCLI("alice", "job", "result", id, "--out", "pool")

	var solo, pool map[string]json.RawMessage
	readJSON(t, filepath.Join(c.dir, "solo", "result.json"), &solo)
	readJSON(t, filepath.Join(c.dir, "pool", "result.json"), &pool)
	for _, k := range []string{"job", "content", "inputs", "shards", "result"} {
		if !bytes.Equal(solo[k], pool[k]) {
			t.Errorf("pool result.json differs from the solo run in %q:\nsolo %s\npool %s", k, solo[k], pool[k])
		}
	}
	type score struct {
		LogLoss  float64 `json:"log_loss"`
		Accuracy float64 `json:"accuracy"`
		Index    int     `json:"index"`
	}
	var res struct {
		K          int     `json:"k"`
		N          int     `json:"n"`
		Ensemble   score   `json:"ensemble"`
		Members    []score `json:"members"`
		MemberMean score   `json:"member_mean"`
		Single     *score  `json:"single"`
	}
	if err := json.Unmarshal(pool["result"], &res); err != nil {
		t.Fatal(err)
	}
	if res.K != 3 || len(res.Members) != 3 || res.N < 50 || res.Single == nil || res.Single.Index != 3 {
		t.Fatalf("ensemble result %s: want 3 members, a single model (shard 3), at least 50 held-out rows", pool["result"])
	}
	if !(res.Ensemble.LogLoss > 0) || res.Ensemble.LogLoss > res.MemberMean.LogLoss {
		t.Fatalf("ensemble log loss %v, members' mean %v: averaging probabilities cannot do worse", res.Ensemble.LogLoss, res.MemberMean.LogLoss)
	}
	t.Logf("held-out (%d rows): ensemble of %d log loss %.4f accuracy %.3f; members' mean %.4f / %.3f; single model %.4f / %.3f",
		res.N, res.K, res.Ensemble.LogLoss, res.Ensemble.Accuracy, res.MemberMean.LogLoss, res.MemberMean.Accuracy, res.Single.LogLoss, res.Single.Accuracy)
}
