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

	// A connection's pair is "host 127.0.0.1:port ↔ host 127.0.0.1:port".
	connected := regexp.MustCompile(`p2p: connected to agg-1, path direct \(host ([0-9.]+):\d+ ↔ host ([0-9.]+):\d+\)`)
	for _, w := range workers {
		l := c.log(w)
		for _, bad := range []string{"no working candidate pair", "no data-channel path", "lease lost"} {
			if n := strings.Count(l, bad); n > 0 {
				t.Errorf("%s's log says %q %d times, first: %s", w, bad, n, lineWith(l, bad))
			}
		}
		for _, m := range connected.FindAllStringSubmatch(l, -1) {
			if m[1] != "127.0.0.1" || m[2] != "127.0.0.1" {
				t.Errorf("%s connected over %s ↔ %s, not loopback: %s", w, m[1], m[2], m[0])
			}
		}
	}
	// Every worker's blobs took its channel: the aggregator counts the
	// bytes.
	st := c.mustCLI("alice", "aggregator", "status")
	pair := regexp.MustCompile(`p2p agg-1 ↔ (worker-\d): path direct, direct (\d+) B`)
	moved := map[string]bool{}
	for _, m := range pair.FindAllStringSubmatch(st, -1) {
		moved[m[1]] = m[2] != "0"
	}
	for _, w := range workers {
		if !moved[w] {
			t.Errorf("aggregator status shows no bytes with %s over a direct data channel:\n%s", w, st)
		}
	}
}

// lineWith returns the first line of log that contains s.
func lineWith(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
