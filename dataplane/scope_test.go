package dataplane

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
)

// fedAt makes a federation whose aggregators serve on addrs.
func fedAt(t *testing.T, addrs ...string) *identity.Federation {
	t.Helper()
	var src strings.Builder
	src.WriteString("federation: test\nregime: own\nmembers:\n")
	for i, a := range addrs {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&src, "  - {name: agg-%d, role: aggregator, public_key: %s, address: %q}\n", i+1, id.Public(), a)
	}
	fed, err := identity.ParseFederation("fed.yaml", []byte(src.String()))
	if err != nil {
		t.Fatal(err)
	}
	return fed
}

// The candidates' scope follows the federation's addresses: all loopback
// (127.0.0.1, ::1, localhost) is loopback only; IP literals elsewhere
// never offer loopback and follow the routes to them; a hostname keeps
// every non-loopback interface; p2p_loopback still forces loopback.
func TestScopeFollowsFederation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addrs    []string
		force    bool
		loopback bool
		routes   int
	}{
		{"loopback", []string{"127.0.0.1:7400", "127.0.0.1:7402"}, false, true, 0},
		{"loopback-v6-and-name", []string{"[::1]:7400", "localhost:7402"}, false, true, 0},
		{"remote", []string{"198.51.100.7:7400", "203.0.113.9:7400"}, false, false, 2},
		{"mixed", []string{"127.0.0.1:7400", "198.51.100.7:7400"}, false, false, 1},
		{"hostnames", []string{"agg1.example.org:7400", "127.0.0.1:7402"}, false, false, 0},
		{"forced", []string{"agg1.example.org:7400"}, true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := scopeOf(fedAt(t, tc.addrs...), tc.force)
			if s.loopback != tc.loopback || len(s.dsts) != tc.routes {
				t.Fatalf("scope of %v (force %v): loopback %v, %d routed addresses; want %v, %d", tc.addrs, tc.force, s.loopback, len(s.dsts), tc.loopback, tc.routes)
			}
			lo, lan := net.IPv4(127, 0, 0, 1), net.IPv4(192, 0, 2, 2)
			if s.ipOK(lo) != tc.loopback || s.ipOK(lan) == tc.loopback {
				t.Fatalf("scope %s: 127.0.0.1 allowed %v, 192.0.2.2 allowed %v", s, s.ipOK(lo), s.ipOK(lan))
			}
		})
	}
}

// candidates returns the addresses of an SDP's ICE candidates.
func candidates(sdp string) []string {
	var out []string
	for _, line := range strings.Split(sdp, "\n") {
		if f := strings.Fields(strings.TrimSpace(line)); len(f) > 4 && strings.HasPrefix(f[0], "a=candidate:") {
			out = append(out, f[4])
		}
	}
	return out
}

// Two members of a federation whose aggregator is on 127.0.0.1, without
// the p2p_loopback flag: each gathers loopback candidates only (no other
// address of this machine, no mDNS name), the pair ICE selects is
// loopback on both ends, and no STUN/TURN server is asked for (policy
// all). With policy relay only servers on loopback are kept.
func TestLoopbackFederationGathersLoopbackOnly(t *testing.T) {
	fed, ids := testFed(t, "a", "b") // agg-1 at 127.0.0.1:1
	box := &Mailbox{}
	var asked atomic.Int32
	offMachine := func(context.Context) ([]ICEServer, error) {
		asked.Add(1)
		return []ICEServer{
			{URLs: []string{"stun:198.51.100.7:3478", "stun:127.0.0.1:3478"}},
			{URLs: []string{"turn:198.51.100.7:3478?transport=udp"}, Username: "u", Credential: "p"},
		}, nil
	}
	natural := func(c *Config) { c.Loopback = false; c.ICE = offMachine }
	a := startPeer(t, fed, ids, box, "a", natural)
	b := startPeer(t, fed, ids, box, "b", natural)
	if a.Scope() != "loopback" {
		t.Fatalf("a's candidates: %s, want loopback", a.Scope())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.Put(ctx, "b", []byte("over loopback")); err != nil {
		t.Fatal(err)
	}
	c := a.liveConn("b")
	if c == nil {
		t.Fatal("no live connection to b after a put")
	}
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	for side, sdp := range map[string]string{"a's offer": pc.LocalDescription().SDP, "b's answer": pc.RemoteDescription().SDP} {
		cands := candidates(sdp)
		if len(cands) == 0 {
			t.Errorf("%s has no candidates", side)
		}
		for _, addr := range cands {
			if ip := net.ParseIP(addr); ip == nil || !ip.IsLoopback() {
				t.Errorf("%s offers %s, not a loopback address:\n%s", side, addr, sdp)
			}
		}
	}
	pair, err := pc.SCTP().Transport().ICETransport().GetSelectedCandidatePair()
	if err != nil || pair == nil {
		t.Fatalf("selected pair: %v, %v", pair, err)
	}
	for _, addr := range []string{pair.Local.Address, pair.Remote.Address} {
		if ip := net.ParseIP(addr); ip == nil || !ip.IsLoopback() {
			t.Errorf("the selected pair %s ↔ %s is not loopback", pair.Local.Address, pair.Remote.Address)
		}
	}
	if !strings.Contains(c.pair, "127.0.0.1") {
		t.Errorf("the pair logged is %q", c.pair)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("STUN/TURN servers were asked for %d times on a loopback federation (policy all)", n)
	}
	if st := statsOf(b.Peer, "a"); st.Path != PathDirect {
		t.Errorf("b's view of a: %+v", st)
	}

	// Policy relay needs the TURN server; one off this machine is dropped.
	relay := startPeer(t, fed, ids, box, "agg-1", func(c *Config) { c.Loopback = false; c.ICE = offMachine; c.Policy = PolicyRelay })
	cfg, err := relay.configuration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ICEServers) != 1 || len(cfg.ICEServers[0].URLs) != 1 || cfg.ICEServers[0].URLs[0] != "stun:127.0.0.1:3478" {
		t.Errorf("relay policy on loopback kept %+v, want only stun:127.0.0.1:3478", cfg.ICEServers)
	}
}

// fakeHTTPS is the HTTPS fallback: it serves from memory and counts.
type fakeHTTPS struct {
	blobs      map[content.Ref][]byte
	gets, puts atomic.Int32
}

func (f *fakeHTTPS) GetBlob(_ context.Context, ref content.Ref) ([]byte, error) {
	f.gets.Add(1)
	b, ok := f.blobs[ref]
	if !ok {
		return nil, fmt.Errorf("no blob %s", ref.Short())
	}
	return b, nil
}

func (f *fakeHTTPS) PutBlob(_ context.Context, b []byte) (content.Ref, error) {
	f.puts.Add(1)
	return content.Hash(b), nil
}

// logLines collects a Logf's lines on a channel, so a test waits for a
// line (an event) instead of sleeping.
func logLines() (func(string, ...any), <-chan string) {
	ch := make(chan string, 256)
	return func(f string, args ...any) {
		select {
		case ch <- fmt.Sprintf(f, args...):
		default:
		}
	}, ch
}

// waitLine waits for a line containing want.
func waitLine(t *testing.T, lines <-chan string, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no log line %q within %v", want, within)
		}
	}
}

// A member's blob mover never waits for a data channel: while the
// aggregator does not answer (its connection attempt runs for minutes
// here) every blob goes over HTTPS at once; the channel is retried in the
// background once that attempt has failed and blobs are moving, and once
// it is up the blobs take it.
func TestBlobsFallBackAtOnceAndRetryInBackground(t *testing.T) {
	fed, ids := testFed(t, "w")
	box := &Mailbox{}
	logf, lines := logLines()
	// w's first attempt waits for an answer agg-1 does not send: it is
	// not running yet.
	timeout := 3 * time.Second
	w := startPeer(t, fed, ids, box, "w", func(c *Config) {
		c.Loopback = false
		c.ConnectTimeout = timeout
		c.RetryMin = 50 * time.Millisecond
		c.Logf = logf
	})
	data := []byte("a blob the pool holds")
	https := &fakeHTTPS{blobs: map[content.Ref][]byte{content.Hash(data): data}}
	b := &Blobs{Peer: w.Peer, Via: "agg-1", HTTPS: https, Logf: logf}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.start(ctx)

	start := time.Now()
	got, err := b.GetBlob(ctx, content.Hash(data))
	if err != nil || string(got) != string(data) {
		t.Fatalf("get while the channel is set up: %q, %v", got, err)
	}
	if _, err := b.PutBlob(ctx, []byte("a result")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= timeout {
		t.Fatalf("the blobs waited %v for the data channel (its attempt runs %v)", d, timeout)
	}
	if https.gets.Load() != 1 || https.puts.Load() != 1 {
		t.Fatalf("https carried %d gets and %d puts, want 1 and 1", https.gets.Load(), https.puts.Load())
	}
	waitLine(t, lines, "p2p: blobs with agg-1 go over https while the data channel is set up", time.Second)
	waitLine(t, lines, "p2p: blobs with agg-1 go over the https fallback", 2*timeout)

	// agg-1 comes up; the next blob (over HTTPS still) is the demand
	// that has the channel retried.
	agg := startPeer(t, fed, ids, box, "agg-1", func(c *Config) { c.Loopback = false })
	if _, err := b.GetBlob(ctx, content.Hash(data)); err != nil {
		t.Fatal(err)
	}
	waitLine(t, lines, "p2p: blobs with agg-1 go over a direct data channel", 2*timeout)
	if _, err := agg.store.PutBytes(data); err != nil {
		t.Fatal(err)
	}
	before := https.gets.Load()
	if got, err := b.GetBlob(ctx, content.Hash(data)); err != nil || string(got) != string(data) {
		t.Fatalf("get over the channel: %q, %v", got, err)
	}
	if https.gets.Load() != before {
		t.Fatal("the blob went over https with the data channel up")
	}
	if st := statsOf(w.Peer, "agg-1"); st.DirectBytes != int64(len(data)) || st.FailedDials < 1 {
		t.Fatalf("w's view of agg-1: %+v", st)
	}
}
