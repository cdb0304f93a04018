package wire

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
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
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testharness.Wrap(m)) }

// A test federation: one aggregator (which hosts the rounds), silos
// hospital-a…, a worker, and an outsider whose forged federation file
// lists it beside the real aggregator.

type world struct {
	tb        testing.TB
	fed       *identity.Federation
	forged    *identity.Federation
	agg       *identity.Identity
	outsider  *identity.Identity
	silos     []string
	ids       map[string]*identity.Identity
	keys      map[string]ed25519.PrivateKey
	transport []*http.Transport
}

func seed(name string) [ed25519.SeedSize]byte {
	return sha256.Sum256([]byte("scellis secagg/wire test identity " + name))
}

func newWorld(tb testing.TB, silos int) *world {
	tb.Helper()
	w := &world{tb: tb, ids: map[string]*identity.Identity{}, keys: map[string]ed25519.PrivateKey{}}
	for _, name := range []string{"agg-1", "w1", "outsider"} {
		s := seed(name)
		w.ids[name] = identity.NewFromSeed(s)
	}
	w.agg, w.outsider = w.ids["agg-1"], w.ids["outsider"]
	var src strings.Builder
	fmt.Fprintf(&src, "federation: test\nregime: consortium\nmembers:\n")
	fmt.Fprintf(&src, "  - {name: agg-1, role: aggregator, public_key: %s, address: \"127.0.0.1:1\"}\n", w.agg.Public())
	fmt.Fprintf(&src, "  - {name: w1, role: worker, public_key: %s}\n", w.ids["w1"].Public())
	for i := range silos {
		name := "hospital-" + string(rune('a'+i))
		if i >= 26 {
			name = fmt.Sprintf("hospital-%03d", i) // past z: a cohort of many sites
		}
		s := seed(name)
		w.ids[name] = identity.NewFromSeed(s)
		w.keys[name] = w.ids[name].PrivateKey() // what a silo hands Participate
		w.silos = append(w.silos, name)
		fmt.Fprintf(&src, "  - {name: %s, role: silo, public_key: %s}\n", name, w.ids[name].Public())
	}
	var err error
	if w.fed, err = identity.ParseFederation("fed.yaml", []byte(src.String())); err != nil {
		tb.Fatal(err)
	}
	forged := fmt.Sprintf("federation: test\nregime: consortium\nmembers:\n"+
		"  - {name: agg-1, role: aggregator, public_key: %s, address: \"127.0.0.1:1\"}\n"+
		"  - {name: hospital-a, role: silo, public_key: %s}\n", w.agg.Public(), w.outsider.Public())
	if w.forged, err = identity.ParseFederation("forged.yaml", []byte(forged)); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, tr := range w.transport {
			tr.CloseIdleConnections()
		}
	})
	return w
}

// params returns the round's Params for the given silos.
func (w *world) params(round string, dim int, silos ...string) secagg.Params {
	p := secagg.Params{Round: round, Dim: dim, Clip: 1, Weighted: true, MaxWeight: 1000, PRG: secagg.DefaultPRG()}
	for _, s := range silos {
		p.Members = append(p.Members, secagg.Member{ID: s, Key: w.keys[s].Public().(ed25519.PublicKey)})
	}
	return p
}

// client returns an HTTP client authenticating as member name of fed,
// pinned to agg-1, through rt's wrapping when given.
func (w *world) client(id *identity.Identity, fed *identity.Federation, wrap func(http.RoundTripper) http.RoundTripper) *http.Client {
	cfg, err := identity.ClientTLSConfig(id, fed, "agg-1", identity.Aggregator)
	if err != nil {
		w.tb.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	w.transport = append(w.transport, tr)
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(tr)
	}
	return &http.Client{Transport: rt}
}

func (w *world) silo(name string) *http.Client { return w.client(w.ids[name], w.fed, nil) }

// siloVia is silo name's client with its link through c.
func (w *world) siloVia(name string, c *cable) *http.Client {
	return w.client(w.ids[name], w.fed, c.wrap)
}

// testHost is a Host served over TLS on a loopback port, as an aggregator
// mounts it, with every request body it receives recorded.
type testHost struct {
	*Host
	url string
	// hostile, when set before the round opens, sees every request
	// after it is recorded and may answer it instead of the host (it
	// returns true then): an aggregator that deviates from the protocol.
	hostile func(w http.ResponseWriter, r *http.Request, body []byte) bool

	mu     sync.Mutex
	bodies []recorded
}

type recorded struct {
	method, path string
	body         []byte
}

func startHost(tb testing.TB, w *world, opt HostOptions) *testHost {
	tb.Helper()
	return serveHost(tb, w, opt, true)
}

// serveHost serves a host, recording request bodies when record is set.
func serveHost(tb testing.TB, w *world, opt HostOptions, record bool) *testHost {
	tb.Helper()
	cfg, err := identity.ServerTLSConfig(w.agg, w.fed)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	th := &testHost{Host: NewHost(w.fed, opt), url: "https://" + ln.Addr().String()}
	mux := http.NewServeMux()
	var h http.Handler = th.Host
	if record {
		h = th.record(th.Host)
	}
	mux.Handle(Prefix, h)
	mux.Handle(HEPrefix, h)
	mux.Handle("/v1/", http.NotFoundHandler()) // the coordinator API lives beside it
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(tls.NewListener(ln, cfg))
	}()
	tb.Cleanup(func() {
		th.Close()
		srv.Close()
		<-served
	})
	return th
}

// roundOf is the start most round tests share: a world of n silos, a host
// (opt), and a round named round of all n silos with dim values, not yet
// open.
func roundOf(tb testing.TB, n int, opt HostOptions, round string, dim int) (*world, *testHost, secagg.Params) {
	tb.Helper()
	w := newWorld(tb, n)
	return w, startHost(tb, w, opt), w.params(round, dim, w.silos...)
}

// openRound is roundOf opened at once under generous deadlines, which
// adjust (if not nil) changes first: the start of most round tests.
func openRound(tb testing.TB, n int, round string, dim int, adjust func(*Deadlines)) (*world, *testHost, secagg.Params) {
	tb.Helper()
	w, th, p := roundOf(tb, n, HostOptions{}, round, dim)
	dl := generous()
	if adjust != nil {
		adjust(&dl)
	}
	th.open(tb, p, dl)
	return w, th, p
}

// open opens p under dl, failing the test if the host refuses.
func (th *testHost) open(tb testing.TB, p secagg.Params, dl Deadlines) {
	tb.Helper()
	if err := th.Open(p, dl); err != nil {
		tb.Fatal(err)
	}
}

// record keeps a copy of every request body.
func (th *testHost) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		th.mu.Lock()
		th.bodies = append(th.bodies, recorded{r.Method, r.URL.Path, b})
		hostile := th.hostile
		th.mu.Unlock()
		if hostile != nil && hostile(w, r, b) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

// cable wraps a site's transport: once cut it fails every request, as a
// pulled network cable would (the site keeps retrying until its context
// ends). cutBefore cuts it before a matching request leaves; cutAfter once
// a matching request was answered with a success.
type cable struct {
	rt        http.RoundTripper
	cutBefore func(*http.Request) bool
	cutAfter  func(*http.Request, *http.Response) bool
	seen      func(*http.Request, *http.Response) // observes every answered request
	cut       atomic.Bool
	cutNow    chan struct{}
	once      sync.Once
}

var errCut = errors.New("test: network cable cut")

func newCable() *cable { return &cable{cutNow: make(chan struct{})} }

func (c *cable) wrap(rt http.RoundTripper) http.RoundTripper { c.rt = rt; return c }

func (c *cable) doCut() { c.once.Do(func() { c.cut.Store(true); close(c.cutNow) }) }

func (c *cable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() || (c.cutBefore != nil && c.cutBefore(r)) {
		c.doCut()
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errCut
	}
	resp, err := c.rt.RoundTrip(r)
	if err == nil {
		if c.seen != nil {
			c.seen(r, resp)
		}
		if c.cutAfter != nil && resp.StatusCode < 300 && c.cutAfter(r, resp) {
			c.doCut()
		}
	}
	return resp, err
}

func endpoint(r *http.Request, name string) bool { return strings.HasSuffix(r.URL.Path, "/"+name) }

// run is one site's Participate, in its own goroutine.
type run struct {
	site   string
	cancel context.CancelFunc
	done   chan error
}

func participate(ctx context.Context, hc *http.Client, th *testHost, p secagg.Params, key ed25519.PrivateKey, x []float64, weight float64, site string) *run {
	ctx, cancel := context.WithCancel(ctx)
	r := &run{site: site, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Participate(ctx, hc, th.url, p, key, x, weight) }()
	return r
}

// startSites starts the Participate of each of silos with its test input
// and weight(i), over via[s] when set (else its own client); it returns
// the runs and the inputs, in the order of silos.
func startSites(ctx context.Context, w *world, th *testHost, p secagg.Params, silos []string, weight func(i int) float64, via map[string]*http.Client) ([]*run, [][]float64) {
	var runs []*run
	var xs [][]float64
	for i, s := range silos {
		hc := via[s]
		if hc == nil {
			hc = w.silo(s)
		}
		x := testInput(s, p.Dim)
		xs = append(xs, x)
		runs = append(runs, participate(ctx, hc, th, p, w.keys[s], x, weight(i), s))
	}
	return runs, xs
}

// rising weighs the i-th site k·(i+1); flat weighs every site k.
func rising(k float64) func(int) float64 { return func(i int) float64 { return k * float64(i+1) } }
func flat(k float64) func(int) float64   { return func(int) float64 { return k } }

// waitAll waits for each run and reports those that failed.
func waitAll(tb testing.TB, runs []*run) {
	tb.Helper()
	for _, r := range runs {
		if err := r.wait(tb); err != nil {
			tb.Errorf("%s: %v", r.site, err)
		}
	}
}

// sum waits for the round's sum on the host, failing the test without
// one.
func (th *testHost) sum(tb testing.TB, ctx context.Context, round string) *secagg.Result {
	tb.Helper()
	res, err := th.Wait(ctx, round)
	if err != nil {
		tb.Fatal(err)
	}
	return res
}

func (r *run) wait(tb testing.TB) error {
	tb.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s: Participate did not return", r.site)
		return nil
	}
}

// inputs returns a vector in [-1, 1] per site, with no structure a test
// could confuse with a mask.
func testInput(site string, dim int) []float64 {
	h := sha256.Sum256([]byte(site))
	x := make([]float64, dim)
	s := uint64(h[0]) | uint64(h[1])<<8 | 1
	for i := range x {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		x[i] = float64(s%2_000_001)/1_000_000 - 1
	}
	return x
}

func codeOfErr(err error) diag.Code {
	if l, ok := diag.As(err); ok {
		return l[0].Code
	}
	return ""
}

// wantCode fails unless err carries a diagnostic with code.
func wantCode(tb testing.TB, what string, err error, code diag.Code) {
	tb.Helper()
	if got := codeOfErr(err); got != code {
		tb.Fatalf("%s: got %v (code %q), want %s", what, err, got, code)
	}
}
