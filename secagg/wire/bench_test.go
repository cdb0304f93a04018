package wire

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/secagg"
)

// BenchmarkRound is one secure aggregation round of 4 silos with
// d = 10^5 over loopback TLS — Host.Open, four concurrent Participate
// calls over mutually authenticated HTTPS (keep-alive connections), and
// Host.Wait — against the same round through the secagg state machines in
// memory, measured in the same run and interleaved:
//
//	x-inmem      ÷ the round driven as secagg's harness and Example drive it:
//	             one client after another, messages passed as values;
//	x-inmem-par  ÷ the same with the four clients of each phase running
//	             concurrently, as the sites do over the network.
//
// Ratios compare the fastest iteration of each, so a noisy neighbour
// inflates neither side alone. consistency-% is the share of the rounds
// over the network (the sum of their phases, as Host's OnPhase times them)
// spent in the consistency round: from the survivor set's publication to
// the last signature — one more exchange per site.
//
// Run: go test -run '^$' -bench Round -benchtime 20x ./secagg/wire/
func BenchmarkRound(b *testing.B) {
	const n, dim = 4, 100_000
	w := newWorld(b, n)
	var (
		mu                 sync.Mutex
		phases, consistent time.Duration
	)
	th := serveHost(b, w, HostOptions{OnPhase: func(_, phase string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		phases += d
		if phase == "consistency" {
			consistent += d
		}
	}}, false)
	clients := map[string]*http.Client{}
	inputs := map[string][]float64{}
	for _, s := range w.silos {
		clients[s] = w.silo(s)
		inputs[s] = testInput(s, dim)
	}
	ctx := context.Background()
	round := 0
	params := func() secagg.Params {
		round++
		return w.params(fmt.Sprintf("bench-%d", round), dim, w.silos...)
	}
	overWire := func() {
		p := params()
		if err := th.Open(p, generous()); err != nil {
			b.Fatal(err)
		}
		errs := make(chan error, n)
		for i, s := range w.silos {
			go func() { errs <- Participate(ctx, clients[s], th.url, p, w.keys[s], inputs[s], float64(i+1)) }()
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		if _, err := th.Wait(ctx, p.Round); err != nil {
			b.Fatal(err)
		}
	}
	inMemory := func(concurrent bool) func() {
		return func() {
			if err := memoryRound(params(), w.silos, w.keys, inputs, concurrent); err != nil {
				b.Fatal(err)
			}
		}
	}
	overWire() // warm up: TLS handshakes, connection pools
	mu.Lock()
	phases, consistent = 0, 0
	mu.Unlock()
	b.SetBytes(8 * dim * n)
	measure(b, overWire, map[string]func(){"inmem": inMemory(false), "inmem-par": inMemory(true)})
	mu.Lock()
	defer mu.Unlock()
	if phases > 0 {
		b.ReportMetric(100*float64(consistent)/float64(phases), "consistency-%")
	}
}

// memoryRound runs one round through secagg.Client and secagg.Server in
// memory, the clients of each phase one after another or concurrently.
func memoryRound(p secagg.Params, sites []string, keys map[string]ed25519.PrivateKey, inputs map[string][]float64, concurrent bool) error {
	srv, err := secagg.NewServer(p)
	if err != nil {
		return err
	}
	cs := map[string]*secagg.Client{}
	for _, s := range sites {
		if cs[s], err = secagg.NewClient(p, s, keys[s]); err != nil {
			return err
		}
	}
	each := func(f func(s string) error) error {
		if !concurrent {
			for _, s := range sites {
				if err := f(s); err != nil {
					return err
				}
			}
			return nil
		}
		errs := make([]error, len(sites))
		var wg sync.WaitGroup
		for i, s := range sites {
			wg.Go(func() { errs[i] = f(s) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	weight := map[string]float64{}
	for i, s := range sites {
		weight[s] = float64(i + 1)
	}
	ks, err := phase(each, func(s string) (*secagg.Advert, error) { return cs[s].Advertise() }, srv.AddAdvert, srv.EndAdvertise)
	if err != nil {
		return err
	}
	dels, err := phase(each, func(s string) (*secagg.Shares, error) { return cs[s].ShareKeys(ks) }, srv.AddShares, srv.EndShare)
	if err != nil {
		return err
	}
	byTo := map[string]*secagg.ShareDelivery{}
	for _, d := range dels {
		byTo[d.To] = d
	}
	mask := func(s string) (*secagg.MaskedInput, error) { return cs[s].MaskInput(byTo[s], inputs[s], weight[s]) }
	req, err := phase(each, mask, srv.AddMaskedInput, srv.EndMask)
	if err != nil {
		return err
	}
	sign := func(s string) (*secagg.SurvivorSig, error) { return cs[s].SignSurvivors(req) }
	if req, err = phase(each, sign, srv.AddSignature, srv.EndConsistency); err != nil {
		return err
	}
	unmask := func(s string) (*secagg.Unmasking, error) { return cs[s].Unmask(req) }
	_, err = phase(each, unmask, srv.AddUnmasking, srv.Finish)
	return err
}

// phase is one phase of memoryRound: each site makes its message (compose)
// and the server takes it (add), the sites as each runs them; then the
// server ends the phase (end).
func phase[M, R any](each func(func(s string) error) error, compose func(s string) (M, error), add func(M) error, end func() (R, error)) (R, error) {
	err := each(func(s string) error {
		m, err := compose(s)
		if err != nil {
			return err
		}
		return add(m)
	})
	if err != nil {
		var none R
		return none, err
	}
	return end()
}

// measure runs op b.N times under the benchmark timer and, interleaved
// with it and off the timer, each baseline once per iteration; it reports
// the fastest op over the fastest run of each baseline as "x-<name>" (as
// secagg's benchmarks do).
func measure(b *testing.B, op func(), baselines map[string]func()) {
	best := map[string]time.Duration{}
	opBest := time.Duration(1<<63 - 1)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for name, f := range baselines {
			t0 := time.Now()
			f()
			if d := time.Since(t0); best[name] == 0 || d < best[name] {
				best[name] = d
			}
		}
		b.StartTimer()
		t0 := time.Now()
		op()
		opBest = min(opBest, time.Since(t0))
	}
	b.StopTimer()
	for name, d := range best {
		b.ReportMetric(float64(opBest)/float64(d), "x-"+name)
	}
	b.ReportMetric(float64(opBest.Microseconds())/1000, "best-ms")
}
