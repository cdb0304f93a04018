package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// treeOf is a two-level tree of coordinator clusters on loopback: a
// parent cluster and two child clusters, each 3 aggregators with its own
// federation file, Raft group and receipt chain (docs/tree.md).
type treeOf struct {
	parent   *cluster
	children map[string]*cluster // by member name in the parent federation
}

// newTree makes the parent federation (alice submits; child-a and
// child-b are its clusters) and one federation per child, each with a
// worker and alice's parent key (so she can read every chain), and writes
// each child node's delegate settings.
func newTree(t *testing.T) *treeOf {
	tr := &treeOf{children: map[string]*cluster{}}
	tr.parent = newCluster(t, "own", 3, member{"alice", "researcher"}, member{"child-a", "cluster"}, member{"child-b", "cluster"})
	alicePub := publicKeyIn(t, filepath.Join(tr.parent.dir, "federation.yaml"), "alice")
	for _, name := range []string{"child-a", "child-b"} {
		c := newCluster(t, "own", 3, member{"w1", "worker"})
		fed, _ := os.ReadFile(filepath.Join(c.dir, "federation.yaml"))
		c.write("federation.yaml", string(fed)+"  - name: alice\n    role: researcher\n    public_key: "+alicePub+"\n")
		c.write("w1.yaml", "name: w1\nidentity: w1/identity.key\nfederation: federation.yaml\ncache_dir: w1/cache\nparallel: 2\nbatch: 25\npoll: 100ms\nisolate: false\n")
		for _, a := range c.aggs {
			b, _ := os.ReadFile(filepath.Join(c.dir, a+".yaml"))
			c.write(a+".yaml", string(b)+fmt.Sprintf("parent_federation: %s\ndelegate_identity: %s\ndelegate_name: %s\ndelegate_batch: 50\n",
				filepath.Join(tr.parent.dir, "federation.yaml"), filepath.Join(tr.parent.dir, name, "identity.key"), name))
		}
		tr.children[name] = c
	}
	return tr
}

// publicKeyIn reads a member's public key from a federation file.
func publicKeyIn(t *testing.T, fed, name string) string {
	b, err := os.ReadFile(fed)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) == "- name: "+name {
			for _, k := range lines[i+1:] {
				if v, ok := strings.CutPrefix(strings.TrimSpace(k), "public_key: "); ok {
					return v
				}
			}
		}
	}
	t.Fatalf("no key for %s in %s", name, fed)
	return ""
}

// peers counts, over a parent job's shards, those each peer verified
// and those it holds a live lease on.
func peerCounts(st jobStatus) (agreeing, leased map[string]int) {
	agreeing, leased = map[string]int{}, map[string]int{}
	for _, s := range st.Shards {
		for _, p := range s.Agreeing {
			agreeing[p]++
		}
		for _, l := range s.Leases {
			leased[l.Peer]++
		}
	}
	return agreeing, leased
}

// The test of a tree of clusters: a 1,000-shard sweep submitted
// to the parent is delegated to two child clusters, computed by their
// workers and verified by their own chains, and reported upward citing
// their chain heads. Child-a's leader is killed mid-job (its new leader
// resumes the delegation from its Raft state), then the whole of child-b
// while it holds parent leases (they expire and child-a takes the
// shards). The job completes with the solo run's result, `receipts
// verify` walks the tree, and a tampered or missing child chain fails it.
// Nine aggregators and two workers: this test costs more than most (see
// the report of issue 22 for its wall time).
func TestTreeOfClusters(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process tree of clusters")
	}
	tr := newTree(t)
	p, a, b := tr.parent, tr.children["child-a"], tr.children["child-b"]
	p.write("sweep.yaml", "name: sweep1k\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 20000, chunks: 1000}}\nreducer: {use: mean, params: {weight: samples}}\n")
	solo := make(chan error, 1)
	go func() {
		_, err := scellisCmd(t, p.dir, "run", "sweep.yaml", "--out", "solo").CombinedOutput()
		solo <- err
	}()

	// Bad delegate settings are refused before the node starts (exit 2).
	badConfig := func(c *cluster, extra, code string) {
		t.Helper()
		b, _ := os.ReadFile(filepath.Join(c.dir, "agg-1.yaml"))
		key, _, _ := strings.Cut(extra, ":")
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(l, key+":") {
				lines = append(lines, l)
			}
		}
		c.write("bad.yaml", strings.Join(lines, "\n")+extra)
		cmd := scellisCmd(t, c.dir, "aggregator", "--config", "bad.yaml")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), code) {
			t.Errorf("aggregator with %q: %v, want exit 2 with %s:\n%s", extra, err, code, out)
		}
	}
	// child-b's key for child-a's name: not the key the parent lists.
	badConfig(a, "delegate_identity: "+filepath.Join(p.dir, "child-b", "identity.key")+"\n", "SC7601")
	p.startAggregators()
	// Every child node checks its parent answers: before the parent
	// starts it would not; here a parent federation whose addresses
	// nobody serves stands for one out of reach.
	fed, _ := os.ReadFile(filepath.Join(p.dir, "federation.yaml"))
	pp := &ports{t: t}
	dead := string(fed)
	for _, m := range []string{"agg-1", "agg-2", "agg-3"} {
		i := strings.Index(dead, "name: "+m)
		j := strings.Index(dead[i:], "address: ") + i + len("address: ")
		k := strings.Index(dead[j:], "\n") + j
		dead = dead[:j] + pp.next() + dead[k:]
	}
	pp.release()
	p.write("unreachable.yaml", dead)
	badConfig(a, "parent_federation: "+filepath.Join(p.dir, "unreachable.yaml")+"\n", "SC7602")

	for _, c := range []*cluster{a, b} {
		for _, n := range c.aggs {
			c.start(n, "aggregator", "--config", n+".yaml")
		}
	}
	a.waitLeader()
	b.waitLeader()
	a.startWorker("w1")
	b.startWorker("w1")
	id := strings.TrimSpace(p.mustCLI("alice", "job", "submit", "sweep.yaml"))

	// Both children deliver verified shards upward.
	waitFor(t, "both children to report shards", 2*time.Minute, func() bool {
		ag, _ := peerCounts(p.status("alice", id))
		return ag["child-a"] > 0 && ag["child-b"] > 0
	})
	// child-b loses its worker: what it leases from now on stays leased.
	b.kill("w1", syscall.SIGKILL)
	// child-a's leader dies; its new leader resumes the delegation.
	oldLeader := a.leader("w1")
	if oldLeader == "" {
		t.Fatal("child-a has no leader")
	}
	before, _ := peerCounts(p.status("alice", id))
	a.kill(oldLeader, syscall.SIGKILL)
	waitFor(t, "child-a's new leader to deliver more shards", 2*time.Minute, func() bool {
		ag, _ := peerCounts(p.status("alice", id))
		l := a.leader("w1")
		return l != "" && l != oldLeader && ag["child-a"] > before["child-a"]+50
	})
	// The whole of child-b dies while it holds parent leases: the job
	// completes only once they expire and child-a takes the shards.
	var held int
	waitFor(t, "child-b to hold parent leases", time.Minute, func() bool {
		_, leased := peerCounts(p.status("alice", id))
		held = leased["child-b"]
		return held > 0
	})
	for _, n := range b.aggs {
		b.kill(n, syscall.SIGKILL)
	}
	waitFor(t, "the job to complete", 3*time.Minute, func() bool { return p.status("alice", id).State == "done" })
	st := p.status("alice", id)
	ag, _ := peerCounts(st)
	if st.Counts.Verified != 1000 || ag["child-a"]+ag["child-b"] != 1000 {
		t.Fatalf("verified %d/1000, by %v", st.Counts.Verified, ag)
	}
	t.Logf("child-b held %d parent leases when it died; shards verified by child: %v", held, ag)

	// The same result as the pool of one.
	if err := <-solo; err != nil {
		t.Fatalf("solo run: %v", err)
	}
	p.mustCLI("alice", "job", "result", id, "--out", "tree")
	var soloRes, treeRes map[string]json.RawMessage
	readJSON(t, filepath.Join(p.dir, "solo", "result.json"), &soloRes)
	readJSON(t, filepath.Join(p.dir, "tree", "result.json"), &treeRes)
	for _, k := range []string{"job", "content", "shards", "work_units", "result"} {
		if !bytes.Equal(soloRes[k], treeRes[k]) {
			t.Errorf("the tree's result.json differs from the solo run in %q:\nsolo %s\ntree %s", k, soloRes[k], treeRes[k])
		}
	}

	// child-b's chain is on its nodes' disks: bring it back to read it.
	for _, n := range b.aggs {
		b.waitExit(n)
		b.restartAggregator(n)
	}
	b.waitLeader()
	childA := "child-a=" + filepath.Join(a.dir, "federation.yaml")
	childB := "child-b=" + filepath.Join(b.dir, "federation.yaml")
	out := p.mustCLI("alice", "receipts", "verify", "--child", childA, "--child", childB)
	for _, want := range []string{"intact: 1000 receipts", "child cluster child-a: chain intact", "child cluster child-b: chain intact"} {
		if !strings.Contains(out, want) {
			t.Fatalf("receipts verify across the tree lacks %q:\n%s", want, out)
		}
	}
	// A missing child chain, and a tampered one, fail with SC7603.
	refused := func(what string, args ...string) {
		t.Helper()
		out, errs, err := p.cli("alice", append([]string{"receipts", "verify"}, args...)...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(errs, "SC7603") {
			t.Errorf("receipts verify with %s: %v, want exit 2 with SC7603:\n%s%s", what, err, out, errs)
		}
	}
	refused("child-b's chain missing", "--child", childA)
	export := a.mustCLI("w1", "receipts", "export", "--format", "json")
	var rs []map[string]any
	if err := json.Unmarshal([]byte(export), &rs); err != nil || len(rs) == 0 {
		t.Fatalf("child-a's export: %v\n%.300s", err, export)
	}
	rs[0]["leader_time"] = rs[0]["leader_time"].(float64) + 1 // a rewritten child receipt
	tampered, _ := json.Marshal(rs)
	p.write("child-a-tampered.json", string(tampered))
	refused("a tampered child chain", "--child", "child-a="+filepath.Join(p.dir, "child-a-tampered.json"), "--child", childB)
}
