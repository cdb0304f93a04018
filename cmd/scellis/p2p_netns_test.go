package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netLab is a small internet in network namespaces: a router namespace
// ("inet") links one public namespace (the aggregator) and, per site, a
// NAT router namespace with the site's host behind it. Names carry a
// random tag so parallel runs do not collide; t.Cleanup deletes every
// namespace (and so every veth and rule in it), also when the test fails.
type netLab struct {
	t   *testing.T
	tag string
	ns  []string
	n   int // sites linked so far
}

// netLabAvailable reports whether the network-namespace lab can run.
func netLabAvailable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return false
		}
	}
	return true
}

// skipUnlessNetLab skips a test that needs root, ip and iptables.
func skipUnlessNetLab(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process network-namespace test")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces (run as root; CI does)")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s for network namespaces (apt-get install iproute2 iptables; .ci/run does)", tool)
		}
	}
}

func newNetLab(t *testing.T) *netLab {
	var b [3]byte
	rand.Read(b[:])
	l := &netLab{t: t, tag: hex.EncodeToString(b[:])}
	t.Cleanup(func() {
		for _, ns := range l.ns {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	l.addNS("inet")
	l.sh("inet", "sysctl -qw net.ipv4.ip_forward=1")
	return l
}

func (l *netLab) name(short string) string { return "sc" + l.tag + "-" + short }

func (l *netLab) addNS(short string) string {
	ns := l.name(short)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		l.t.Fatalf("ip netns add %s: %v %s", ns, err, out)
	}
	l.ns = append(l.ns, ns)
	l.sh(short, "ip link set lo up")
	return ns
}

// sh runs a command line (no shell) in namespace short.
func (l *netLab) sh(short, line string) {
	l.t.Helper()
	args := append([]string{"netns", "exec", l.name(short)}, strings.Fields(line)...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("%s: %s: %v %s", short, line, err, out)
	}
}

// client returns an HTTP client whose connections start in namespace
// short (netnsClient).
func (l *netLab) client(short string) *http.Client { return netnsClient(l.name(short)) }

// netnsClient returns an HTTP client whose connections start in the named
// network namespace (to scrape the /metrics of a process that listens
// there): each socket is made on an OS thread moved into the namespace,
// and that thread is discarded after (its goroutine ends locked to it).
func netnsClient(name string) *http.Client {
	ns := "/var/run/netns/" + name
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			c   net.Conn
			err error
		}
		ch := make(chan dialed, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			f, err := os.Open(ns)
			if err != nil {
				ch <- dialed{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- dialed{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- dialed{c, err}
		}()
		d := <-ch
		return d.c, d.err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

// link joins namespaces a and b with a veth pair on subnet 10.77.<net>.0/24
// (a gets .1, b gets .2) and returns b's address.
func (l *netLab) link(a, b string, net int) string {
	l.t.Helper()
	va, vb := fmt.Sprintf("v%s%da", l.tag, net), fmt.Sprintf("v%s%db", l.tag, net)
	if out, err := exec.Command("ip", "link", "add", va, "netns", l.name(a), "type", "veth", "peer", "name", vb, "netns", l.name(b)).CombinedOutput(); err != nil {
		l.t.Fatalf("veth %s-%s: %v %s", a, b, err, out)
	}
	l.sh(a, fmt.Sprintf("ip addr add 10.77.%d.1/24 dev %s", net, va))
	l.sh(a, "ip link set "+va+" up")
	l.sh(b, fmt.Sprintf("ip addr add 10.77.%d.2/24 dev %s", net, vb))
	l.sh(b, "ip link set "+vb+" up")
	return fmt.Sprintf("10.77.%d.2", net)
}

// public adds a host on the router's own subnet (no NAT) and returns its
// namespace and address.
func (l *netLab) public(short string) (string, string) {
	l.n++
	l.addNS(short)
	addr := l.link("inet", short, l.n)
	l.sh(short, fmt.Sprintf("ip route add default via 10.77.%d.1", l.n))
	return l.name(short), addr
}

// site adds a host behind its own NAT router: mode is "cone" (a full
// cone: MASQUERADE keeps the host's ports, and inbound UDP to a mapped
// port is forwarded to the host, as a full-cone NAT does — plain Linux
// MASQUERADE alone is port-restricted, and an unsolicited packet from the
// peer can leave a conntrack entry that makes the mapping port-dependent)
// or "symmetric" (MASQUERADE --random: a fresh random port per
// destination, which defeats STUN-learned addresses). extra iptables rules (filter table,
// FORWARD chain, on the router) may restrict the site further.
func (l *netLab) site(short, mode string, forward ...string) string {
	l.n++
	wanNet, lanNet := l.n, 100+l.n
	router := short + "-nat"
	l.addNS(router)
	l.addNS(short)
	l.link("inet", router, wanNet)
	l.link(router, short, lanNet)
	l.sh(router, fmt.Sprintf("ip route add default via 10.77.%d.1", wanNet))
	l.sh(router, "sysctl -qw net.ipv4.ip_forward=1")
	l.sh(short, fmt.Sprintf("ip route add default via 10.77.%d.1", lanNet))
	wan := fmt.Sprintf("v%s%db", l.tag, wanNet)
	rule := "iptables -t nat -A POSTROUTING -o " + wan + " -j MASQUERADE"
	if mode == "symmetric" {
		rule += " --random"
	}
	l.sh(router, rule)
	if mode == "cone" {
		l.sh(router, fmt.Sprintf("iptables -t nat -A PREROUTING -i %s -p udp -j DNAT --to-destination 10.77.%d.2", wan, lanNet))
	}
	for _, f := range forward {
		l.sh(router, "iptables -A FORWARD "+f)
	}
	return l.name(short)
}

// Through NATs and firewalls in network namespaces, with the aggregator on
// a public address whose firewall lets in only its API (TCP) and its
// STUN/TURN port (UDP):
//   - alice and w1, each behind a cone NAT, connect directly via STUN
//     (scellis p2p probe w1 from alice says path direct, srflx/prflx);
//   - bob and w2, each behind a symmetric NAT, get no direct path: their
//     data channel falls back to the TURN relay on the aggregator (a probe
//     from bob says relayed); w2 gets no direct path to the firewalled
//     aggregator either, so the pool job's blobs it moves go relayed (its
//     log says so, aggregator status shows the pair relayed);
//   - w3's site lets out nothing but TCP to the aggregator's API port: its
//     blobs go over HTTPS at once, while its ICE attempt runs in the
//     background, and over the HTTPS fallback once the attempt failed; its
//     log says so;
//   - the job, run by w2 and w3 (two replicas: both run every shard),
//     completes.
//
// About 30-40 s: one aggregator and four peers' processes, a consortium
// job needs two workers, and the test waits for w3's ICE attempt to fail
// (ConnectTimeout, 12 s after w3 starts) — which no blob of w3 waits for.
// It replaces TestP2PPoolJobOverDataChannels where it runs.
func TestP2PThroughNATs(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	skipUnlessNetLab(t)
	lab := newNetLab(t)
	aggNS, aggIP := lab.public("agg")

	c := newCluster(t, "consortium", 1, member{"w1", "worker"}, member{"w2", "worker"}, member{"w3", "worker"}, member{"alice", "researcher"}, member{"bob", "researcher"})
	fedFile := c.dir + "/federation.yaml"
	fed, err := os.ReadFile(fedFile)
	if err != nil {
		t.Fatal(err)
	}
	// The aggregator listens on its public address; in its namespace every
	// port is free, so the loopback ports newCluster picked will do.
	c.write("federation.yaml", strings.ReplaceAll(string(fed), "127.0.0.1:", aggIP+":"))
	var apiPort, turnPort string
	for _, line := range strings.Split(strings.ReplaceAll(string(fed), "127.0.0.1:", aggIP+":"), "\n") {
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), "address: "+aggIP+":"); ok {
			apiPort = a
		}
	}
	turnPort = "3478"
	// Each namespace has its own loopback: the aggregator and the workers
	// serve /metrics on 127.0.0.1:9090 in theirs.
	const metricsAddr = "127.0.0.1:9090"
	c.write("agg-1.yaml", "name: agg-1\nidentity: agg-1/identity.key\nfederation: federation.yaml\ndata_dir: agg-1/data\nlease_ttl: 2s\nlog_level: info\nturn_listen: "+aggIP+":"+turnPort+"\nturn_allow_peers: [10.77.0.0/16]\nmetrics_listen: "+metricsAddr+"\n")
	for _, w := range []string{"w2", "w3"} {
		c.write(w+".yaml", c.read(w+".yaml")+"metrics_listen: "+metricsAddr+"\n")
	}
	// The aggregator's site firewall: its API and STUN/TURN only.
	wanAgg := fmt.Sprintf("v%s%db", lab.tag, 1)
	for _, r := range []string{
		"-A INPUT -i " + wanAgg + " -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -p tcp --dport " + apiPort + " -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -p udp --dport " + turnPort + " -j ACCEPT",
		"-A INPUT -i " + wanAgg + " -j DROP",
	} {
		lab.sh("agg", "iptables "+r)
	}
	aliceNS := lab.site("alice", "cone")
	w1NS := lab.site("w1", "cone")
	w2NS := lab.site("w2", "symmetric")
	bobNS := lab.site("bob", "symmetric")
	w3NS := lab.site("w3", "cone",
		"-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
		"-p tcp -d "+aggIP+" --dport "+apiPort+" -j ACCEPT",
		"-j DROP")
	c.netns = map[string]string{"agg-1": aggNS, "alice": aliceNS, "w1": w1NS, "w2": w2NS, "w3": w3NS, "bob": bobNS}

	job := c.sweep2()
	c.startAggregators()
	c.startWorker("w1")

	// Cone ↔ cone: direct, through the NATs' mappings learned by STUN.
	out := c.mustCLI("alice", "p2p", "probe", "w1")
	if !strings.Contains(out, "alice → w1: path direct") {
		t.Errorf("alice → w1 (both behind cone NATs): %s", out)
	}
	// w1 stops before the job, so that w2 and w3 run the two replicas of
	// every shard.
	c.kill("w1", 2)
	c.waitExit("w1")
	c.startWorker("w2")
	c.startWorker("w3")
	// A worker's blobs never wait for its data channel (they go over
	// HTTPS until it is up): w2's relayed one is waited for here, so that
	// the job's blobs show the relay at work.
	waitFor(t, "w2's relayed data channel", untilNoticed(), func() bool { return c.channelUp("alice", "agg-1", "w2", "relayed") })
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", job))

	// While the job runs (w3's ICE attempt runs meanwhile, its blobs
	// over HTTPS): symmetric ↔ symmetric, no direct path; the TURN relay
	// carries it.
	out = c.mustCLI("bob", "p2p", "probe", "w2")
	if !strings.Contains(out, "bob → w2: path relayed") {
		t.Errorf("bob → w2 (both behind symmetric NATs): %s", out)
	}
	waitFor(t, "the job to complete", untilRun(), func() bool { return c.status("alice", id).State == "done" })

	// w3's attempt may still be running when the job is done: its blobs
	// did not wait for it. It ends within ConnectTimeout of w3's start.
	waitFor(t, "w3's data channel attempt to fail", untilNoticed(), func() bool {
		return scrapeWith(t, lab.client("w3"), metricsAddr)["scellis_p2p_failed_dials_total"] > 0
	})
	st := c.mustCLI("alice", "aggregator", "status")
	if !strings.Contains(st, "p2p agg-1 ↔ w2: path relayed") || !strings.Contains(st, "turn "+aggIP+":"+turnPort) {
		t.Errorf("aggregator status does not show w2 relayed and the TURN server:\n%s", st)
	}
	// The same, as metrics: bytes and connections by path.
	for _, want := range []struct {
		ns, series string
	}{
		{"w2", `scellis_p2p_bytes_total{path="relayed"}`},
		{"w2", `scellis_p2p_connections_total{path="relayed"}`},
		{"w3", `scellis_p2p_bytes_total{path="https"}`},
		{"w3", `scellis_p2p_failed_dials_total`},
		{"agg", `scellis_p2p_bytes_total{path="relayed"}`},
		{"agg", `scellis_p2p_connections{path="relayed"}`},
	} {
		if m := scrapeWith(t, lab.client(want.ns), metricsAddr); m[want.series] <= 0 {
			t.Errorf("%s's /metrics: %s is %v, want > 0", want.ns, want.series, m[want.series])
		}
	}
}
