package wire

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// TestHierarchicalRoundOverTLS runs a hierarchical round over real
// sockets: a parent host (agg-1) and two child hosts (agg-2, agg-3), each
// an aggregator of the federation serving mutual TLS on its own loopback
// port under its own identity; nine silos in sub-cohorts of four and five
// take part with ParticipateWith against their child, each child takes its
// masked partial sum (WaitPartial) and forwards it to the parent over
// mutual TLS as its aggregator (Forward), and the parent's released sum
// must equal the flat sum of the nine inputs, exactly on the grid (the
// inputs are sent as grid integers). Every unmasking a child received
// must be sealed, and a child must refuse to hand out a sum (SC6019). A
// silo may not post a partial sum (403). Each child adds its outer mask
// before forwarding: it posts its signed outer key (as its delegate, a
// member of role cluster) and long-polls the other's from the parent's
// host (PostOuterKey, FetchOuterKeys); the parent's host refuses a key
// from a silo or of another cluster (403), one not signed by its
// cluster's delegate key (SC6020) and a second key for a sub-cohort
// (409), and takes a resend (204); it refuses a partial sum whose child
// posted no outer key (SC6020).
func TestHierarchicalRoundOverTLS(t *testing.T) {
	w := newWorld(t, 9)
	// The federation again, with two more aggregators: the children.
	var src strings.Builder
	fmt.Fprintf(&src, "federation: test\nregime: consortium\nmembers:\n")
	for i, a := range []string{"agg-1", "agg-2", "agg-3"} {
		if w.ids[a] == nil {
			w.ids[a] = identity.NewFromSeed(seed(a))
		}
		fmt.Fprintf(&src, "  - {name: %s, role: aggregator, public_key: %s, address: \"127.0.0.1:%d\"}\n", a, w.ids[a].Public(), i+1)
	}
	for _, s := range w.silos {
		fmt.Fprintf(&src, "  - {name: %s, role: silo, public_key: %s}\n", s, w.ids[s].Public())
	}
	// The child clusters, as the parent's federation lists them: their
	// delegate keys sign their outer keys.
	for _, c := range []string{"child-a", "child-b"} {
		w.ids[c] = identity.NewFromSeed(seed(c))
		fmt.Fprintf(&src, "  - {name: %s, role: cluster, public_key: %s}\n", c, w.ids[c].Public())
	}
	fed, err := identity.ParseFederation("fed.yaml", []byte(src.String()))
	if err != nil {
		t.Fatal(err)
	}
	w.fed = fed
	// serveHost serves as w.agg: switch it for each child's identity.
	serveAs := func(name string) *testHost {
		w.agg = w.ids[name]
		defer func() { w.agg = w.ids["agg-1"] }()
		return serveHost(t, w, HostOptions{}, true)
	}
	parentHost, child2, child3 := serveAs("agg-1"), serveAs("agg-2"), serveAs("agg-3")
	clientTo := func(from, server string) *http.Client {
		cfg, err := identity.ClientTLSConfig(w.ids[from], fed, server, identity.Aggregator)
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
		w.transport = append(w.transport, tr)
		return &http.Client{Transport: tr}
	}

	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	const dim, grid = 64, 16
	sub := func(round string, silos []string) secagg.Params {
		p := w.params(round, dim, silos...)
		p.GridBits, p.Parent, p.Sites = grid, key.PublicKey().Bytes(), len(w.silos)
		return p
	}
	pa, pb := sub("hier-a", w.silos[:4]), sub("hier-b", w.silos[4:])
	children := map[string]*testHost{"hier-a": child2, "hier-b": child3}
	childName := map[string]string{"hier-a": "agg-2", "hier-b": "agg-3"}
	cluster := map[string]string{"hier-a": "child-a", "hier-b": "child-b"}
	plan := []secagg.SubCohort{{Round: "hier-a", Cluster: "child-a"}, {Round: "hier-b", Cluster: "child-b"}}
	delegate := func(c string) (ed25519.PublicKey, bool) { // the child's copy of the parent federation
		m, ok := fed.Member(c)
		return m.PublicKey.Ed25519(), ok && m.Role == identity.Cluster
	}
	if err := parentHost.OpenParent("hier", key, []secagg.Params{pa, pb}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A silo may not post a partial sum, nor an outer key; a cluster
	// posts its own key only, signed with its delegate key.
	wantCode(t, "a silo's partial sum", Forward(ctx, w.silo(w.silos[0]), parentHost.url, "hier", &secagg.PartialSum{Round: "hier-a", Masked: []byte{0}}), diag.SecAggWireForbidden)
	outer := map[string]*secagg.OuterMask{}
	for _, c := range plan {
		o, err := secagg.NewOuterMask("hier", c.Round, c.Cluster, w.ids[c.Cluster].PrivateKey())
		if err != nil {
			t.Fatal(err)
		}
		outer[c.Round] = o
	}
	wantCode(t, "a silo's outer key", PostOuterKey(ctx, w.silo(w.silos[0]), parentHost.url, "hier", outer["hier-a"].Key()), diag.SecAggWireForbidden)
	wantCode(t, "a cluster posting another's outer key", PostOuterKey(ctx, clientTo("child-b", "agg-1"), parentHost.url, "hier", outer["hier-a"].Key()), diag.SecAggWireForbidden)
	forged, err := secagg.NewOuterMask("hier", "hier-a", "child-a", w.ids["child-b"].PrivateKey())
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "an outer key signed by another cluster's key", PostOuterKey(ctx, clientTo("agg-2", "agg-1"), parentHost.url, "hier", forged.Key()), diag.SecAggOuterKeys)
	if err := PostOuterKey(ctx, clientTo("child-a", "agg-1"), parentHost.url, "hier", outer["hier-a"].Key()); err != nil {
		t.Fatal(err)
	}
	// A partial sum whose child posted no outer key cannot carry its
	// outer mask: refused.
	wantCode(t, "a partial sum before its child's outer key", Forward(ctx, clientTo("child-b", "agg-1"), parentHost.url, "hier", &secagg.PartialSum{Round: "hier-b", Masked: []byte{0}}), diag.SecAggOuterKeys)
	second, err := secagg.NewOuterMask("hier", "hier-a", "child-a", w.ids["child-a"].PrivateKey())
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a second outer key for one sub-cohort", PostOuterKey(ctx, clientTo("child-a", "agg-1"), parentHost.url, "hier", second.Key()), diag.SecAggWireConflict)

	bound, err := pa.EncodedBound()
	if err != nil {
		t.Fatal(err)
	}
	flat := make([]int64, dim)
	var runs []chan error
	for _, p := range []secagg.Params{pa, pb} {
		if err := children[p.Round].Open(p, Deadlines{}); err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Members {
			enc := make([]int64, dim)
			for i, x := range testInput(m.ID, dim) {
				enc[i] = int64(math.Round(x * float64(bound)))
				flat[i] += enc[i]
			}
			done := make(chan error, 1)
			hc := clientTo(m.ID, childName[p.Round])
			go func() {
				done <- ParticipateWith(ctx, hc, children[p.Round].url, p, w.keys[m.ID], Input{Encoded: enc, Weight: 1})
			}()
			runs = append(runs, done)
		}
		// The child relays: it posts its outer key as its delegate,
		// takes its masked sum, adds its outer mask once it holds the
		// other child's key, and forwards it.
		done := make(chan error, 1)
		child, hc := children[p.Round], clientTo(cluster[p.Round], "agg-1")
		go func() {
			// Wait gives no sum of a relayed round (and takes nothing).
			if _, err := child.Wait(ctx, p.Round); codeOfErr(err) != diag.SecAggRelayed {
				done <- fmt.Errorf("child %s: Wait gave %v, want SC6019", p.Round, err)
				return
			}
			o := outer[p.Round]
			err := PostOuterKey(ctx, hc, parentHost.url, "hier", o.Key())
			if err == nil { // a resend is taken (204)
				err = PostOuterKey(ctx, hc, parentHost.url, "hier", o.Key())
			}
			var keys *secagg.OuterKeys
			if err == nil {
				keys, err = FetchOuterKeys(ctx, hc, parentHost.url, "hier")
			}
			var ps *secagg.PartialSum
			if err == nil {
				ps, err = child.WaitPartial(ctx, p.Round)
			}
			if err == nil {
				err = o.Apply(p, ps, plan, keys.Keys, delegate)
			}
			if err == nil {
				err = Forward(ctx, hc, parentHost.url, "hier", ps)
			}
			done <- err
		}()
		runs = append(runs, done)
	}
	for _, done := range runs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Both children forwarded: the parent holds each partial sum (a
	// child that dies now is not needed, aggregator.watchChildren).
	if !parentHost.HasPartial("hier", pa.Round) || !parentHost.HasPartial("hier", pb.Round) || parentHost.HasPartial("hier", "hier-z") {
		t.Fatalf("HasPartial: %v %v %v; want true true false", parentHost.HasPartial("hier", pa.Round), parentHost.HasPartial("hier", pb.Round), parentHost.HasPartial("hier", "hier-z"))
	}
	res, err := parentHost.WaitParent(ctx, "hier")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Contributors) != 9 || res.Weight != 9 {
		t.Fatalf("contributors %v, weight %v; want the nine silos", res.Contributors, res.Weight)
	}
	for i, v := range res.Sum {
		if got := math.Ldexp(v, grid); got != float64(flat[i]) {
			t.Fatalf("sum[%d] = %v·2^-%d, want the flat sum %d·2^-%d", i, got, grid, flat[i], grid)
		}
	}

	// What the children received: every unmasking sealed to the parent.
	for round, th := range children {
		sealed := 0
		th.mu.Lock()
		for _, b := range th.bodies {
			if strings.HasSuffix(b.path, "/unmasking") {
				u, err := secagg.ParseUnmasking(b.body)
				if err != nil || len(u.Sealed) == 0 || len(u.Seeds)+len(u.Keys) != 0 {
					t.Fatalf("%s: the child received an unmasking that is not sealed to the parent", round)
				}
				sealed++
			}
		}
		th.mu.Unlock()
		if sealed < 4 {
			t.Fatalf("%s: the child received %d unmaskings", round, sealed)
		}
	}
	// A hierarchical round open when the parent's host closes ends with
	// SC6107, not a hang.
	if err := parentHost.OpenParent("hier-2", key, []secagg.Params{sub("hier-2a", w.silos[:4]), sub("hier-2b", w.silos[4:])}); err != nil {
		t.Fatal(err)
	}
	parentHost.Close()
	if _, err := parentHost.WaitParent(ctx, "hier-2"); codeOfErr(err) != diag.SecAggWireUnavailable {
		t.Fatalf("a parent round at Close: %v, want SC6107", err)
	}
}
