package wire

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/transport"
)

// fixture: the harness's federation with four silos (newWorld) and a Host
// served over TLS on loopback, for threshold-he rounds.
type fixture struct {
	*world
	host *testHost
}

func newFixture(t *testing.T) *fixture {
	w := newWorld(t, 4)
	return &fixture{world: w, host: serveHost(t, w, HostOptions{LongPoll: 2 * time.Second}, false)}
}

// heParams is a threshold-he round of the given silos.
func (f *fixture) heParams(round string, dim int, bound int64, silos []string) he.Params {
	p := he.Params{Round: round, Dim: dim, Bound: bound, Seed: make([]byte, 32)}
	rand.Read(p.Seed)
	for _, s := range silos {
		p.Members = append(p.Members, secagg.Member{ID: s, Key: f.ids[s].Public().Ed25519()})
	}
	return p
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

// client is site's client, crashing after its ciphertext when die is set.
func (f *fixture) client(site string, die context.CancelFunc) *http.Client {
	if die == nil {
		return f.silo(site)
	}
	return f.world.client(f.ids[site], f.fed, func(rt http.RoundTripper) http.RoundTripper { return &dies{rt: rt, cancel: die} })
}

// run opens a round of the four silos and has them take part, the ones in
// die crashing right after sending their ciphertext. It returns the
// host's outcome, each site's error and the inputs.
func (f *fixture) run(t *testing.T, round string, die map[string]bool) (*he.Result, map[string]error, [][]int64) {
	const dim = 1000
	p := f.heParams(round, dim, 1<<30, f.silos)
	// A short decrypt deadline: a crashed decryptor is replaced after it.
	if err := f.host.OpenHE(p, Deadlines{Advertise: time.Minute, Share: time.Minute, Mask: time.Minute, Unmask: 2 * time.Second}); err != nil {
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
		hc := f.client(s, crash)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer scancel()
			err := ParticipateHE(sctx, transport.HTTPS{Client: hc, Base: f.host.url}, p, f.ids[s].PrivateKey(), inputs[i], 0)
			mu.Lock()
			errs[s] = err
			mu.Unlock()
		}()
	}
	res, err := f.host.WaitHE(ctx, round)
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
	ds, _ := diag.As(err)
	return slices.ContainsFunc(ds, func(d *diag.Diagnostic) bool { return d.Code == c })
}
