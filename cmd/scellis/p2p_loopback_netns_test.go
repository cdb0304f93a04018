package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// loopbackNetns makes a network namespace whose only interface is lo (up)
// and returns its name; t.Cleanup deletes it. The test skips without root
// or ip. Unlike netLab it needs no iptables: nothing leaves the namespace.
func loopbackNetns(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process network-namespace test")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace (run as root; CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip for a network namespace (apt-get install iproute2)")
	}
	var b [3]byte
	rand.Read(b[:])
	ns := "sc" + hex.EncodeToString(b[:]) + "-lo"
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v %s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v %s", ns, err, out)
	}
	return ns
}

// The layout `federation init --hosts 127.0.0.1` writes — one aggregator
// and four workers, their configs unchanged (no p2p_loopback) — run in a
// network namespace that has only lo: the federation's addresses are all
// loopback, so every member gathers loopback candidates and its data
// channel to the aggregator comes up over 127.0.0.1. A 1,000-shard
// trivial sweep completes without a worker stalling on a data channel
// ("no working candidate pair", "no data-channel path") or losing a
// lease. Before the candidates followed the federation, every worker's
// ICE found nothing to pair here and each blob waited out a connection
// attempt (12 s) once a minute, long enough to lose leases.
//
// The time is the pool's own pace for 1,000 tiny shards (logged below).
func TestP2PLoopbackLayoutInNetns(t *testing.T) {
	t.Parallel() // its own namespace, processes and directories
	ns := loopbackNetns(t)
	root := t.TempDir()
	// Inside the namespace every port is free: init's default ports do.
	mustRun(t, scellisCmd(t, root, "federation", "init", "--dir", "fed", "--hosts", "127.0.0.1",
		"--aggregators", "1", "--workers", "4", "--regime", "own", "--researcher", "alice"))
	dir := filepath.Join(root, "fed")
	workers := []string{"worker-1", "worker-2", "worker-3", "worker-4"}
	c := &cluster{t: t, dir: dir, aggs: []string{"agg-1"}, procs: map[string]*exec.Cmd{}, exits: map[string]chan struct{}{}, netns: map[string]string{}}
	t.Cleanup(c.stopAll)
	for _, m := range append([]string{"agg-1", "alice"}, workers...) {
		c.netns[m] = ns
	}
	for _, m := range append([]string{"agg-1"}, workers...) {
		cfg := c.read(filepath.Join(m, map[bool]string{true: "aggregator.yaml", false: "worker.yaml"}[m == "agg-1"]))
		if strings.Contains(cfg, "p2p_loopback") {
			t.Fatalf("federation init wrote p2p_loopback into %s's config:\n%s", m, cfg)
		}
	}
	// Each worker serves /metrics, inside the namespace, on a port of its
	// own: its failed data-channel dials are counted there.
	metricsAddr := map[string]string{}
	for i, w := range workers {
		metricsAddr[w] = fmt.Sprintf("127.0.0.1:%d", 9091+i)
		c.write(filepath.Join(w, "worker.yaml"), c.read(filepath.Join(w, "worker.yaml"))+"metrics_listen: "+metricsAddr[w]+"\n")
	}
	c.start("agg-1", "aggregator", "--config", "agg-1/aggregator.yaml")
	c.waitLeader()
	for _, w := range workers {
		c.start(w, "worker", "--config", w+"/worker.yaml")
	}
	// Each worker sets its channel up as it starts, in the background
	// (its blobs would go over HTTPS meanwhile, without waiting): waited
	// for here, so that the job's blobs show the channels at work however
	// fast the pool runs the job.
	for _, w := range workers {
		waitFor(t, w+"'s data channel", untilNoticed(), func() bool { return c.channelUp("alice", "agg-1", w, "direct") })
	}
	const shards = 1000
	c.write("trivial.star", "def run(params, inputs):\n    return {\"v\": params[\"chunk\"]}\n")
	c.write("trivial.yaml", fmt.Sprintf("name: trivial\nprogram: ./trivial.star\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: concat\n", shards, shards))
	start := time.Now()
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", "trivial.yaml"))
	waitFor(t, "the job to complete", 2*untilLongRun(), func() bool { return c.status("alice", id).State == "done" })
	elapsed := time.Since(start)
	t.Logf("%d shards, 4 workers, in %v (%.0f shards/s)", shards, elapsed.Round(time.Millisecond), float64(shards)/elapsed.Seconds())
	if st := c.status("alice", id); st.Counts.Verified != shards {
		t.Fatalf("verified %d/%d", st.Counts.Verified, shards)
	}

	// No worker found its data channel without a path (its failed dials,
	// /metrics) or lost a lease (the pool's peer record); every worker's
	// channel used loopback candidates on both sides and carried its
	// blobs (the aggregator's status).
	scrapeNS := netnsClient(ns)
	peers := c.peers("alice")
	st, ok := c.statuses("alice")["agg-1"]
	if !ok || st.DataPlane == nil {
		t.Fatalf("agg-1's status has no data plane: %+v", st)
	}
	loopback := regexp.MustCompile(`^host 127\.0\.0\.1:\d+ ↔ host 127\.0\.0\.1:\d+$`)
	for _, w := range workers {
		if m := scrapeWith(t, scrapeNS, metricsAddr[w]); m == nil || m["scellis_p2p_failed_dials_total"] != 0 {
			t.Errorf("%s's failed data-channel dials: %v (nil: /metrics did not answer)", w, m["scellis_p2p_failed_dials_total"])
		}
		if p := peers[w]; p.Expired != 0 {
			t.Errorf("%s lost %d leases (expired)", w, p.Expired)
		}
		var found bool
		for _, p := range st.DataPlane.Pairs {
			if p.Peer != w {
				continue
			}
			found = true
			if p.Path != "direct" || p.DirectBytes <= 0 || !loopback.MatchString(p.Candidates) {
				t.Errorf("agg-1 ↔ %s: path %s, %d direct bytes, candidates %q; want a direct loopback channel that carried blobs", w, p.Path, p.DirectBytes, p.Candidates)
			}
		}
		if !found {
			t.Errorf("agg-1 made no data channel with %s", w)
		}
	}
}
