package aggregator

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"

	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// A client that trickles a request body (the one byte every 5 s)
// is cut off at the body deadline instead of holding a connection forever.
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, trust.Own, 1, Options{BodyTimeout: time.Second})
	cfg, err := identity.ClientTLSConfig(p.ids["w1"], p.fed, "agg-1", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	agg, _ := p.fed.Member("agg-1")
	addr := agg.Address
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const declared = 1000
	fmt.Fprintf(conn, "POST /v1/results HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, declared)

	// The server answers (or closes) once the deadline passes; until then
	// the client keeps trickling.
	answered := make(chan *http.Response, 1)
	go func() {
		resp, _ := http.ReadResponse(bufio.NewReader(conn), nil)
		answered <- resp
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for {
		select {
		case resp := <-answered:
			if resp != nil && resp.StatusCode < 400 {
				t.Fatalf("slow body accepted: %s", resp.Status)
			}
			if sent >= declared {
				t.Fatalf("the whole body was read before the server gave up")
			}
			return
		case <-tick.C:
			if sent < declared {
				if _, err := conn.Write([]byte{' '}); err == nil {
					sent++
				}
			}
		case <-time.After(2 * time.Minute): // hang detector only
			t.Fatal("the server never cut the slow client off")
		}
	}
}

// A member holds at most a few long polls at once: more are refused with
// SC7109 (429) instead of each pinning a goroutine and an event
// subscription on the node, and a place comes back when a poll ends.
func TestLeasePollsBoundedPerMember(t *testing.T) {
	p := newTestPool(t, trust.Own, 1, Options{SiloLease: 20 * time.Minute}) // held polls last up to 10 min
	cfg, err := identity.ClientTLSConfig(p.ids["w1"], p.fed, "agg-1", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, MaxConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	agg, _ := p.fed.Member("agg-1")
	poll := func(ctx context.Context) (int, diag.Code) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+agg.Address+"/v1/lease", strings.NewReader(`{"wait_ms":30000}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		var d struct{ Diagnostics diag.List }
		if json.NewDecoder(resp.Body).Decode(&d) == nil && len(d.Diagnostics) > 0 {
			return resp.StatusCode, d.Diagnostics[0].Code
		}
		return resp.StatusCode, ""
	}
	held, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 4 {
		go poll(held)
	}
	waitUntil(t, "four held lease polls", 2*time.Minute, func() bool { return p.node.api.Held("w1") == 4 })
	if status, code := poll(t.Context()); status != http.StatusTooManyRequests || code != diag.PoolBusy {
		t.Fatalf("a fifth lease poll: %d %s, want 429 %s", status, code, diag.PoolBusy)
	}
	cancel()
	// The places come back when the polls end.
	waitUntil(t, "the held polls to end", 2*time.Minute, func() bool { return p.node.api.Held("w1") == 0 })
}

// A child cluster's heartbeat (api.LeaseRequest.Heartbeat; liveness.go):
// each of its nodes holds one; the child stays alive while any is held,
// its leader's connection closing is no loss while another node beats,
// and the last one's connection closing makes it gone at once, whatever
// the silo lease (here 20 minutes), until it beats again. A heartbeat
// never leases anything.
func TestHeartbeatLiveness(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, trust.Own, 1, Options{SiloLease: 20 * time.Minute})
	cfg, err := identity.ClientTLSConfig(p.ids["w1"], p.fed, "agg-1", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	agg, _ := p.fed.Member("agg-1")
	// One client per "node": each its own connection.
	beat := func(ctx context.Context) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+agg.Address+"/v1/lease", strings.NewReader(`{"max":5,"heartbeat":true,"wait_ms":30000}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := hc.Do(req); err == nil {
			var out struct{ Grants []json.RawMessage }
			json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if len(out.Grants) > 0 {
				t.Errorf("a heartbeat leased %d shards", len(out.Grants))
			}
		}
	}
	// Work is leasable: a lease poll would be answered with it at once.
	plan, err := p.compile(t.Context(), p.writeJob(map[string]string{
		"job.yaml": "name: hb\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 3000, chunks: 3}}\nreducer: {use: mean, params: {weight: samples}}\n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := submit(t.Context(), p.client("alice"), p.fed, plan); err != nil {
		t.Fatal(err)
	}
	first, stopFirst := context.WithCancel(t.Context())
	second, stopSecond := context.WithCancel(t.Context())
	defer stopFirst()
	defer stopSecond()
	go beat(first)
	go beat(second)
	waitUntil(t, "two held heartbeats", 2*time.Minute, func() bool { return p.node.api.Beating("w1") == 2 })
	if !p.node.alive("w1") {
		t.Fatal("a peer holding heartbeats is not alive")
	}
	stopFirst() // the child's leader dies
	waitUntil(t, "one held heartbeat", 2*time.Minute, func() bool { return p.node.api.Beating("w1") == 1 })
	if !p.node.alive("w1") {
		t.Fatal("a peer still beating through another node was judged gone")
	}
	stopSecond() // and then every other node
	waitUntil(t, "the child judged gone", 2*time.Minute, func() bool { return !p.node.alive("w1") })
	if n := p.node.api.Beating("w1"); n != 0 {
		t.Fatalf("%d heartbeats still counted", n)
	}
	// The child comes back: its first heartbeat makes it alive again
	// (its silos rejoin at the next round planned).
	back, stopBack := context.WithCancel(t.Context())
	defer stopBack()
	go beat(back)
	waitUntil(t, "the child alive again", 2*time.Minute, func() bool { return p.node.alive("w1") })
	js, err := p.node.fsm.machine().Job(plan.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range js.Shards {
		if len(s.Leases) > 0 {
			t.Fatalf("shard %d was leased by a heartbeat: %+v", s.Index, s.Leases)
		}
	}
}
