package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// layoutChain is a tree of three levels, one node per cluster: root is
// the parent of mid, which is the parent of leaf, which leads the worker.
const layoutChain = `def topology(members, params):
    return {"clusters": [
        {"name": "root", "parent": None, "nodes": ["agg-1"], "leads": []},
        {"name": "mid", "parent": "root", "nodes": ["agg-2"], "leads": []},
        {"name": "leaf", "parent": "mid", "nodes": ["agg-3"], "leads": ["w1"]},
    ]}
`

// A tree deeper than two levels (docs/tree.md): a sweep submitted at the
// root is delegated to mid, whose sub-jobs are ordinary jobs to its own
// child, leaf, whose worker computes them. The worker runs the root job's
// plan (each sub-job's delegation carries the root's index of every shard,
// coordinator.Delegation.Plan), leaf reports to mid, mid to the root, and
// the result is the solo run's. `receipts verify` walks all three chains:
// the root's receipts cite mid's, mid's cite leaf's, and leaving leaf's
// chain out fails with SC7603. One node per cluster keeps it to three
// aggregators and a worker (about 10 s).
func TestTreeThreeLevels(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process tree of clusters")
	}
	pf := newPoolFile(t, 3)
	pf.member("w1", "worker")
	cs, _ := pf.layOut(layoutChain, []treeCluster{
		{"root", []string{"agg-1"}, nil},
		{"mid", []string{"agg-2"}, nil},
		{"leaf", []string{"agg-3"}, []string{"w1"}},
	})
	root, mid, leaf := cs["root"], cs["mid"], cs["leaf"]
	root.write("sweep.yaml", "name: sweep\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 4000, chunks: 200}}\nreducer: {use: mean, params: {weight: samples}}\n")
	solo := make(chan error, 1)
	go func() {
		_, err := scellisCmd(t, root.dir, "run", "sweep.yaml", "--out", "solo").CombinedOutput()
		solo <- err
	}()
	for _, c := range []*cluster{root, mid, leaf} {
		c.startAggregators()
	}
	leaf.startWorker("w1")
	id := strings.TrimSpace(root.mustCLI("alice", "job", "submit", "sweep.yaml"))
	waitFor(t, "the sweep to complete through three levels", untilRun(), func() bool { return root.status("alice", id).State == "done" })
	if ag, _ := peerCounts(root.status("alice", id)); ag["mid"] != 200 || len(ag) != 1 {
		t.Fatalf("the root's shards were verified by %v, want mid's, all 200", ag)
	}
	// mid's sub-jobs were verified by leaf, as a peer of mid. A sub-job
	// may also end unverified and cancelled (on a loaded machine leaf's
	// worker can start after the parent's lease TTL, and mid hands the
	// shards back, handBackStalled); then a later sub-job holds them. What
	// must hold: no sub-job was verified by anyone but leaf, and together
	// they verified every shard the root took from mid.
	var subs []struct {
		ID        string
		Delegated *struct{ Job string }
	}
	if err := json.Unmarshal([]byte(mid.mustCLI("alice", "--json", "job", "ls")), &subs); err != nil || len(subs) == 0 {
		t.Fatalf("mid's jobs: %v", err)
	}
	byLeaf := 0
	for _, s := range subs {
		if s.Delegated == nil || s.Delegated.Job != id {
			t.Fatalf("mid holds a job that is not a sub-job of the root's: %+v", s)
		}
		st := mid.status("alice", s.ID)
		ag, leased := peerCounts(st)
		for p := range ag {
			if p != "leaf" {
				t.Errorf("mid's sub-job %s (%s, counts %+v, leased by %v) was verified by %v, want leaf's only", s.ID, st.State, st.Counts, leased, ag)
			}
		}
		byLeaf += ag["leaf"]
	}
	if byLeaf < 200 {
		t.Errorf("mid's %d sub-jobs had %d shards verified by leaf, want all 200 of the root's", len(subs), byLeaf)
	}

	sameResultAsSolo(t, root, id, solo)
	midFed := "mid=" + filepath.Join(mid.dir, "federation.yaml")
	leafFed := "leaf=" + filepath.Join(leaf.dir, "federation.yaml")
	verifyAcross(t, root, []string{"intact: 200 receipts", "child cluster mid: chain intact", "child cluster leaf: chain intact"}, midFed, leafFed)
	if out, errs, err := root.cli("alice", "receipts", "verify", "--child", midFed); !isExit2(err) || !strings.Contains(errs, "SC7603") || !strings.Contains(errs, "leaf") {
		t.Errorf("receipts verify without leaf's chain: %v, want exit 2 with SC7603 naming leaf:\n%s%s", err, out, errs)
	}
}

// isExit2 reports whether err is a process's exit with status 2.
func isExit2(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 2
}
