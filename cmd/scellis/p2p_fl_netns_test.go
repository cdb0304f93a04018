package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A federated round through NATs, in network namespaces, with the
// aggregator on a public address whose firewall lets in only its API
// (TCP) and its STUN/TURN port (UDP), as in TestP2PThroughNATs:
//   - h1 and h2, each behind a symmetric NAT, get no direct path to the
//     aggregator: their round bundles, models, contribution records and
//     secure-aggregation messages go through the TURN relay (their logs
//     say so, aggregator status shows the pairs relayed, with bytes);
//   - h3's site lets out nothing but TCP to the aggregator's API port:
//     everything goes over the HTTPS fallback, and its log says so;
//   - the round, with its three-site minimum, completes.
//
// About 30 s, run beside the other tests: h3's blobs go over HTTPS at
// once, but its first secure-aggregation exchange waits out one ICE
// attempt (ConnectTimeout, 12 s: a Call waits for a first attempt) before
// it falls back, which is what the fallback case costs a site whose
// secure aggregation is set to go over data channels.
func TestFLRoundThroughNATs(t *testing.T) {
	t.Parallel() // its own namespaces, processes and directories
	skipUnlessNetLab(t)
	lab := newNetLab(t)
	aggNS, aggIP := lab.public("agg")
	const turnPort = "3478"
	// The round waits for h3's first exchange, held by its ICE attempt.
	c, silos := survivalCluster(t, 1, 3, "turn_listen: "+aggIP+":"+turnPort+"\nturn_allow_peers: [10.77.0.0/16]\nround_join_timeout: 1m\n")
	fed, err := os.ReadFile(filepath.Join(c.dir, "federation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fedSrc := strings.ReplaceAll(string(fed), "127.0.0.1:", aggIP+":")
	c.write("federation.yaml", fedSrc)
	const siloMetrics = "127.0.0.1:9090"
	p2p := func(s string) map[string]float64 { return scrapeWith(t, lab.client(s), siloMetrics) }
	for _, s := range silos { // silos default to https
		cfg, err := os.ReadFile(filepath.Join(c.dir, s+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		// Each silo's namespace has its own loopback: /metrics on
		// 127.0.0.1:9090 in each.
		c.write(s+".yaml", string(cfg)+"ice_policy: all\nmetrics_listen: "+siloMetrics+"\n")
	}
	var apiPort string
	for _, line := range strings.Split(fedSrc, "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "address: "+aggIP+":"); ok {
			apiPort = p
		}
	}
	wanAgg := fmt.Sprintf("v%s%db", lab.tag, 1)
	for _, r := range []string{
		"-A INPUT -i " + wanAgg + " -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -p tcp --dport " + apiPort + " -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -p udp --dport " + turnPort + " -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -j DROP",
	} {
		lab.sh("agg", "iptables "+r)
	}
	c.netns = map[string]string{
		"agg-1": aggNS,
		"alice": lab.site("alice", "cone"),
		"h1":    lab.site("h1", "symmetric"),
		"h2":    lab.site("h2", "symmetric"),
		"h3": lab.site("h3", "cone",
			"-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
			"-p tcp -d "+aggIP+" --dport "+apiPort+" -j ACCEPT",
			"-j DROP"),
	}
	c.runSpec("nat.yaml", 1)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	// A silo's blobs never wait for its data channel (they go over HTTPS
	// until it is up): h1's and h2's relayed ones are waited for here, so
	// that the round's blobs show the relay at work.
	for _, s := range []string{"h1", "h2"} {
		waitFor(t, s+"'s relayed data channel", untilNoticed(), func() bool { return p2p(s)[`scellis_p2p_connections{path="relayed"}`] > 0 })
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "nat.yaml"))
	waitFor(t, "the run to complete", untilRun(), func() bool { return c.run(id).State == "done" })

	// Every silo's update is in the round's sum (fl watch --json, from
	// the silos' signed records; the CLI runs in alice's namespace, where
	// the federation's addresses route); h1's and h2's blobs and secure
	// aggregation went over their relayed channels, nothing over https;
	// h3's over https, its channel never up.
	if rows := c.rounds(id); len(rows) != 1 || !slices.Equal(rows[0].Participants, silos) {
		t.Errorf("round 0 summed %+v, want %v", rows, silos)
	}
	for _, s := range []string{"h1", "h2"} {
		m := p2p(s)
		if m[`scellis_p2p_bytes_total{path="relayed"}`] <= 0 || m["scellis_p2p_fallbacks_total"] != 0 || m[`scellis_p2p_bytes_total{path="https"}`] != 0 {
			t.Errorf("%s (symmetric NAT, TURN reachable): relayed bytes %v, https bytes %v, fallbacks %v; want relayed only", s,
				m[`scellis_p2p_bytes_total{path="relayed"}`], m[`scellis_p2p_bytes_total{path="https"}`], m["scellis_p2p_fallbacks_total"])
		}
	}
	if m := p2p("h3"); m["scellis_p2p_fallbacks_total"] <= 0 || m[`scellis_p2p_bytes_total{path="relayed"}`]+m[`scellis_p2p_bytes_total{path="direct"}`] != 0 {
		t.Errorf("h3 (API port only): fallbacks %v, data-channel bytes %v; want everything over https", m["scellis_p2p_fallbacks_total"],
			m[`scellis_p2p_bytes_total{path="relayed"}`]+m[`scellis_p2p_bytes_total{path="direct"}`])
	}
	st := c.mustCLI("alice", "aggregator", "status")
	for _, want := range []string{"p2p agg-1 ↔ h1: path relayed", "p2p agg-1 ↔ h2: path relayed", "turn " + aggIP + ":" + turnPort} {
		if !strings.Contains(st, want) {
			t.Errorf("aggregator status lacks %q:\n%s", want, st)
		}
	}
}
