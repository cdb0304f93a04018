package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// testFed makes a federation of one aggregator and the named silos.
func testFed(t testing.TB, names ...string) (*identity.Federation, map[string]*identity.Identity) {
	t.Helper()
	ids := map[string]*identity.Identity{}
	var src strings.Builder
	src.WriteString("federation: test\nregime: consortium\nmembers:\n")
	for i, n := range append([]string{"agg-1"}, names...) {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
		if i == 0 {
			fmt.Fprintf(&src, "  - {name: %s, role: aggregator, public_key: %s, address: \"127.0.0.1:1\"}\n", n, id.Public())
		} else {
			fmt.Fprintf(&src, "  - {name: %s, role: silo, public_key: %s}\n", n, id.Public())
		}
	}
	fed, err := identity.ParseFederation("fed.yaml", []byte(src.String()))
	if err != nil {
		t.Fatal(err)
	}
	return fed, ids
}

// boxSignaller signals through an in-memory Mailbox; alter, if set,
// rewrites every signal in transit (a hostile broker).
type boxSignaller struct {
	box   *Mailbox
	self  string
	alter func(*Signal)
}

func (b *boxSignaller) Send(_ context.Context, s Signal) error {
	if b.alter != nil {
		b.alter(&s)
	}
	return b.box.Post(b.self, s)
}

func (b *boxSignaller) Receive(ctx context.Context) ([]Signal, error) {
	return b.box.Take(ctx, b.self, 200*time.Millisecond), nil
}

type testPeer struct {
	*Peer
	store *blob.Store
}

func startPeer(t testing.TB, fed *identity.Federation, ids map[string]*identity.Identity, box *Mailbox, name string, mod func(*Config)) testPeer {
	t.Helper()
	store, err := blob.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Identity: ids[name], Name: name, Fed: fed, Signal: &boxSignaller{box: box, self: name}, Store: store, Loopback: true, ConnectTimeout: 15 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); p.Close(); <-done })
	return testPeer{p, store}
}

func randomBlob(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func statsOf(p *Peer, member string) PairStats {
	for _, s := range p.Stats() {
		if s.Peer == member {
			return s
		}
	}
	return PairStats{}
}

// Two peers on loopback: a blob goes up and comes back over a direct
// data channel, hash-checked, and the path is reported.
func TestDirectPutGet(t *testing.T) {
	fed, ids := testFed(t, "a", "b")
	box := &Mailbox{}
	a := startPeer(t, fed, ids, box, "a", nil)
	b := startPeer(t, fed, ids, box, "b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	data := randomBlob(t, 300<<10)
	ref, err := a.Put(ctx, "b", data)
	if err != nil {
		t.Fatal(err)
	}
	if !b.store.Has(ref) {
		t.Fatal("b did not store the blob a put")
	}
	got, err := a.Get(ctx, "b", ref)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the blob came back different")
	}
	if _, err := a.Get(ctx, "b", content.Hash([]byte("absent"))); err == nil {
		t.Fatal("a blob b does not hold was served")
	} else if ds, ok := diag.As(err); !ok || ds[0].Code != diag.P2PTransfer {
		t.Fatalf("missing blob: want SC7204, got %v", err)
	}
	st := statsOf(a.Peer, "b")
	if st.Path != PathDirect || st.DirectBytes != 2*int64(len(data)) || st.Transfers != 2 {
		t.Fatalf("a's view of b: %+v", st)
	}
	if st := statsOf(b.Peer, "a"); st.Path != PathDirect || st.DirectBytes != 2*int64(len(data)) {
		t.Fatalf("b's view of a: %+v", st)
	}
}

// With ice_policy relay both peers use only the embedded TURN server:
// the blob crosses it, and the path says so.
func TestRelayPolicyUsesTURN(t *testing.T) {
	fed, ids := testFed(t, "a", "b")
	srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1), AllowPeers: loopbackOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	box := &Mailbox{}
	relay := func(c *Config) {
		c.Policy = PolicyRelay
		name := c.Name
		c.ICE = func(context.Context) ([]ICEServer, error) { return srv.Credentials(name), nil }
	}
	a := startPeer(t, fed, ids, box, "a", relay)
	b := startPeer(t, fed, ids, box, "b", relay)
	data := randomBlob(t, 200<<10)
	ref, err := b.store.PutBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := a.Get(ctx, "b", ref)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the blob came back different")
	}
	if st := statsOf(a.Peer, "b"); st.Path != PathRelayed || st.RelayedBytes != int64(len(data)) {
		t.Fatalf("a's view of b: %+v", st)
	}
	if ts := srv.Stats(); ts.RelayedBytes < int64(len(data)) || ts.Allocations == 0 {
		t.Fatalf("the TURN server relayed %d bytes with %d allocations, want ≥ %d", ts.RelayedBytes, ts.Allocations, len(data))
	}
}

// A broker that swaps the fingerprint in the SDP (to sit in the middle of
// DTLS), or the signed one, is caught: the connection is refused.
func TestTamperedFingerprintRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alter func(*Signal)
	}{
		{"sdp", func(s *Signal) {
			s.SDP = strings.Replace(s.SDP, "a=fingerprint:sha-256 ", "a=fingerprint:sha-256 00:", 1)
		}},
		{"signed-field", func(s *Signal) { s.Fingerprint = "sha-256 00:11:22" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fed, ids := testFed(t, "a", "b")
			box := &Mailbox{}
			var logs strings.Builder
			a := startPeer(t, fed, ids, box, "a", func(c *Config) { c.ConnectTimeout = 3 * time.Second })
			startPeer(t, fed, ids, box, "b", func(c *Config) {
				c.Signal.(*boxSignaller).alter = tc.alter // b's answers are altered in transit
				c.Logf = func(f string, args ...any) { fmt.Fprintf(&logs, f+"\n", args...) }
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := a.Put(ctx, "b", []byte("x"))
			ds, ok := diag.As(err)
			if !ok || ds[0].Code != diag.P2PSignalRefused {
				t.Fatalf("want SC7201, got %v", err)
			}
		})
	}
}

func TestMailboxBounds(t *testing.T) {
	box := &Mailbox{PerPair: 2, TTL: time.Hour}
	s := Signal{From: "a", To: "b", Kind: KindOffer}
	for i := range 2 {
		if err := box.Post("a", s); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := box.Post("a", s); err == nil {
		t.Fatal("a third unread signal from a to b was accepted")
	}
	if err := box.Post("c", s); err == nil {
		t.Fatal("c posted a signal claiming to be from a")
	}
	if got := box.Take(context.Background(), "b", 0); len(got) != 2 {
		t.Fatalf("b read %d signals, want 2", len(got))
	}
	s.SDP = strings.Repeat("x", MaxSignalBytes)
	if err := box.Post("a", s); err == nil {
		t.Fatal("an oversized signal was accepted")
	}
	short := &Mailbox{TTL: time.Nanosecond}
	if err := short.Post("a", Signal{From: "a", To: "b", Kind: KindOffer}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // the TTL is the thing under test
	if n := short.Pending(); n != 0 {
		t.Fatalf("%d expired signals still pending", n)
	}
}
