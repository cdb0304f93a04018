package hewire

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/testharness"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testharness.Wrap(m)) }

// fixture: a federation of one aggregator and four silos, a Host served
// over TLS on loopback, and each silo's mutually authenticated client.
type fixture struct {
	fed   *identity.Federation
	ids   map[string]*identity.Identity
	silos []string
	host  *Host
	url   string
	trs   []*http.Transport
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{ids: map[string]*identity.Identity{}}
	id := func(name string) *identity.Identity {
		f.ids[name] = identity.NewFromSeed(sha256.Sum256([]byte("scellis hewire test " + name)))
		return f.ids[name]
	}
	var src strings.Builder
	fmt.Fprintf(&src, "federation: test\nregime: consortium\nmembers:\n  - {name: agg-1, role: aggregator, public_key: %s, address: \"127.0.0.1:1\"}\n", id("agg-1").Public())
	for _, s := range []string{"hospital-a", "hospital-b", "hospital-c", "hospital-d"} {
		fmt.Fprintf(&src, "  - {name: %s, role: silo, public_key: %s}\n", s, id(s).Public())
		f.silos = append(f.silos, s)
	}
	var err error
	if f.fed, err = identity.ParseFederation("fed.yaml", []byte(src.String())); err != nil {
		t.Fatal(err)
	}
	cfg, err := identity.ServerTLSConfig(f.ids["agg-1"], f.fed)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.host, f.url = NewHost(f.fed, HostOptions{LongPoll: 2 * time.Second}), "https://"+ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle(Prefix, f.host)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(tls.NewListener(ln, cfg)) }()
	t.Cleanup(func() {
		f.host.Close()
		srv.Close()
		<-served
		for _, tr := range f.trs {
			tr.CloseIdleConnections()
		}
	})
	return f
}

// dies makes a client's requests fail once it has posted its ciphertext:
// the site crashed after encrypting.
type dies struct {
	rt     http.RoundTripper
	dead   atomic.Bool
	cancel context.CancelFunc // ends the site's Participate: the process is gone
}

func (d *dies) RoundTrip(r *http.Request) (*http.Response, error) {
	if d.dead.Load() {
		return nil, errors.New("connection refused (the site is down)")
	}
	resp, err := d.rt.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/ciphertext") {
		d.dead.Store(true)
		d.cancel()
	}
	return resp, err
}

func (f *fixture) client(t *testing.T, site string, die context.CancelFunc) *http.Client {
	cfg, err := identity.ClientTLSConfig(f.ids[site], f.fed, "agg-1", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	f.trs = append(f.trs, tr)
	if die != nil {
		return &http.Client{Transport: &dies{rt: tr, cancel: die}}
	}
	return &http.Client{Transport: tr}
}

// run opens a round of the four silos and has them take part, the ones in
// die crashing right after sending their ciphertext. It returns the
// host's outcome, each site's error and the inputs.
func (f *fixture) run(t *testing.T, round string, die map[string]bool) (*he.Result, map[string]error, [][]int64) {
	const dim = 1000
	p := he.Params{Round: round, Dim: dim, Bound: 1 << 30, Seed: make([]byte, 32)}
	rand.Read(p.Seed)
	for _, s := range f.silos {
		p.Members = append(p.Members, secagg.Member{ID: s, Key: f.ids[s].Public().Ed25519()})
	}
	// A short decrypt deadline: a crashed decryptor is replaced after it.
	if err := f.host.Open(p, wire.Deadlines{Advertise: time.Minute, Share: time.Minute, Mask: time.Minute, Unmask: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	inputs := make([][]int64, len(f.silos))
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, s := range f.silos {
		inputs[i] = make([]int64, dim)
		for j := range inputs[i] {
			inputs[i][j] = int64(j*(i+1)) - 7000
		}
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		var crash context.CancelFunc
		if die[s] {
			crash = scancel
		}
		hc := f.client(t, s, crash)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer scancel()
			err := Participate(sctx, hc, f.url, p, f.ids[s].PrivateKey(), inputs[i], 0)
			mu.Lock()
			errs[s] = err
			mu.Unlock()
		}()
	}
	res, err := f.host.Wait(ctx, round)
	wg.Wait()
	if err != nil {
		errs["host"] = err
	}
	return res, errs, inputs
}

// TestRoundOverTLS: four silos over mutual TLS; one crashes right after
// sending its ciphertext and is among the first decryptors — the round
// still opens the exact sum of all four with three survivors (t = 3). Then
// a round where two crash after encrypting ends for everyone with SC6004.
func TestRoundOverTLS(t *testing.T) {
	f := newFixture(t)
	res, errs, inputs := f.run(t, "he-round-1", map[string]bool{"hospital-a": true})
	if res == nil {
		t.Fatalf("no sum: %v", errs)
	}
	want := make([]int64, len(inputs[0]))
	for _, in := range inputs {
		for j, v := range in {
			want[j] += v
		}
	}
	if !slices.Equal(res.Sum, want) || len(res.Contributors) != 4 || slices.Contains(res.Decryptors, "hospital-a") {
		t.Fatalf("sum exact %v, contributors %v, decryptors %v", slices.Equal(res.Sum, want), res.Contributors, res.Decryptors)
	}
	for _, s := range []string{"hospital-b", "hospital-c", "hospital-d"} {
		if errs[s] != nil {
			t.Errorf("%s: %v", s, errs[s])
		}
	}

	res, errs, _ = f.run(t, "he-round-2", map[string]bool{"hospital-a": true, "hospital-b": true})
	if res != nil || !hasCode(errs["host"], diag.SecAggBelowThreshold) {
		t.Fatalf("two of four crashed after encrypting: want SC6004 and no sum, got %v, %v", res, errs["host"])
	}
	for _, s := range []string{"hospital-c", "hospital-d"} {
		if !hasCode(errs[s], diag.SecAggBelowThreshold) {
			t.Errorf("%s: want SC6004, got %v", s, errs[s])
		}
	}
}

func hasCode(err error, c diag.Code) bool {
	ds, ok := diag.As(err)
	if !ok {
		return false
	}
	for _, d := range ds {
		if d.Code == c {
			return true
		}
	}
	return false
}
