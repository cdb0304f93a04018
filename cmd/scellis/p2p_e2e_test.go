package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sweep2 writes a 2-shard sweep over a small generated hospital file.
func (c *cluster) sweep2() string {
	mustRun(c.t, scellisCmd(c.t, c.dir, "datagen", "hospitals", "--sites", "1", "--rows", "200", "--out", "data"))
	c.write("sweep2.yaml", `name: sweep2
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.1, 0.5], l2: [0.0]}
reducer: {use: collect, params: {metric: auc, goal: max}}
params: {model: logistic, epochs: 1, batch_size: 32, test_frac: 0.3, seed: 5}
inputs:
  data: {path: data/hospital-1.csv, label: outcome, class: confidential}
`)
	return "sweep2.yaml"
}

func (c *cluster) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
	return string(b)
}

// A pool job whose blobs (bundle, inputs, results) go over data channels
// on loopback: worker w1 directly, w2 (ice_policy relay) through the
// aggregator's embedded TURN relay. The workers' logs and `scellis
// aggregator status` say which path each pair used; `scellis p2p probe`
// reports the path too. About 20 s: a consortium job needs two workers
// (two replicas), and the relayed one sets up a TURN allocation. Where the
// network-namespace lab runs (root with ip and iptables: CI),
// TestP2PThroughNATs covers the same paths through real NATs, and this
// test skips to keep CI within its budget.
func TestP2PPoolJobOverDataChannels(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	if netLabAvailable() {
		t.Skip("covered by TestP2PThroughNATs, which runs here")
	}
	c := newCluster(t, "consortium", 1, member{"w1", "worker"}, member{"w2", "worker"}, member{"alice", "researcher"})
	// p2p_loopback and --loopback are implied by the loopback federation
	// and deprecated; still accepted, as configs and scripts have them.
	c.write("agg-1.yaml", "name: agg-1\nidentity: agg-1/identity.key\nfederation: federation.yaml\ndata_dir: agg-1/data\nlease_ttl: 2s\nlog_level: error\n"+
		"turn_listen: 127.0.0.1:0\nturn_allow_peers: [127.0.0.0/8]\np2p_loopback: true\n")
	// Each worker serves /metrics: its data-channel connections, bytes by
	// path and fallbacks.
	pp := &ports{t: t}
	metrics := map[string]string{"w1": pp.next(), "w2": pp.next()}
	pp.release()
	c.write("w1.yaml", "name: w1\nidentity: w1/identity.key\nfederation: federation.yaml\ncache_dir: w1/cache\npoll: 100ms\np2p_loopback: true\nmetrics_listen: "+metrics["w1"]+"\n")
	c.write("w2.yaml", "name: w2\nidentity: w2/identity.key\nfederation: federation.yaml\ncache_dir: w2/cache\npoll: 100ms\np2p_loopback: true\nice_policy: relay\nmetrics_listen: "+metrics["w2"]+"\n")
	job := c.sweep2()
	c.startAggregators()
	c.startWorker("w1")
	c.startWorker("w2")
	// Blobs never wait for a data channel (they go over HTTPS until it
	// is up): the channels, set up as the workers start, are waited for
	// here (open on the worker's side), so that the job's blobs take them.
	for w, path := range map[string]string{"w1": "direct", "w2": "relayed"} {
		waitFor(t, w+"'s data channel", untilNoticed(), func() bool { return scrape(t, metrics[w])[`scellis_p2p_connections{path="`+path+`"}`] > 0 })
	}
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", job))
	waitFor(t, "the job to complete", untilRun(), func() bool { return c.status("alice", id).State == "done" })

	for w, path := range map[string]string{"w1": "direct", "w2": "relayed"} {
		m := scrape(t, metrics[w])
		if m[`scellis_p2p_bytes_total{path="`+path+`"}`] <= 0 || m["scellis_p2p_fallbacks_total"] != 0 || m[`scellis_p2p_bytes_total{path="https"}`] != 0 {
			t.Errorf("%s's blobs: %v B over a %s data channel, %v B over https, %v fallbacks; want the %s channel only", w,
				m[`scellis_p2p_bytes_total{path="`+path+`"}`], path, m[`scellis_p2p_bytes_total{path="https"}`], m["scellis_p2p_fallbacks_total"], path)
		}
	}
	out := c.mustCLI("alice", "aggregator", "status")
	for _, want := range []string{"p2p agg-1 ↔ w1: path direct", "p2p agg-1 ↔ w2: path relayed", "turn 127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("aggregator status lacks %q:\n%s", want, out)
		}
	}
	probe := c.mustCLI("alice", "p2p", "probe", "agg-1", "--loopback", "--bytes", "65536")
	if !strings.Contains(probe, "alice → agg-1: path direct") {
		t.Errorf("probe: %s", probe)
	}
}

// The data plane does not hang on the first-listed aggregator: with agg-1
// down, worker w1's blobs go over a data channel to agg-2 or agg-3, and
// alice's probe of w1 connects — their signals are posted to the first
// aggregator that takes them, and each member long-polls every
// aggregator's mailbox. About 20 s (50 s at load average 30): three
// aggregators (the pool needs a majority with one down), one worker, a
// two-shard job. It runs also where the namespace lab runs: no other
// test kills the first aggregator.
func TestP2PWithoutFirstAggregator(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	// No p2p_loopback: the federation's addresses are loopback, which
	// implies it.
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	c.kill("agg-1", syscall.SIGKILL)
	c.waitExit("agg-1")
	c.startWorker("w1")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-p2p", 2)))
	waitFor(t, "the job to complete without agg-1", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	if !c.channelUp("alice", "agg-2", "w1", "direct") && !c.channelUp("alice", "agg-3", "w1", "direct") {
		t.Errorf("neither agg-2 nor agg-3 made a direct data channel with w1:\n%s", c.mustCLI("alice", "aggregator", "status"))
	}
	if out := c.mustCLI("alice", "p2p", "probe", "w1", "--bytes", "65536"); !strings.Contains(out, "alice → w1: path direct") {
		t.Errorf("probe of w1 with agg-1 down: %s", out)
	}
}
