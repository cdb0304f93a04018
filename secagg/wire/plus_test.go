package wire

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// TestPlusRoundOfManySites: a round of 101 silos, the smallest cohort
// above secagg.DefaultPlusAbove, whose params leave the protocol to the cohort
// size, runs SecAgg+ on a sparse graph through the real host over mutual
// TLS on a loopback port, each site with its own Participate and
// connection. Two sites lose their link before sending their input and
// two after it was accepted: the sum is the plain sum of the contributors
// (the two late losses among them: their self-mask seeds are rebuilt from
// their neighbours' shares; the early ones' pair masks are removed with
// theirs), the two early ones are named dropped, and every other site's
// Participate succeeds.
//
// Once a site's link is cut the host is told (Excuse, as the aggregator
// does for a site that declines), so no phase waits out a deadline and
// every deadline can be an hour: on a loaded machine, and under -race, a
// cohort this size takes seconds per phase, and a short deadline would
// drop honest sites at random. Dropouts found by a deadline are
// TestDropBeforeMasking's and TestDropAfterMasking's. d is small: the
// test is about the cohort, not the vector. Its cost is the protocol's
// (X25519 agreements and advert signatures with its ~40 neighbours a
// site, 101 TLS clients): ~3 s of CPU, ~15–20 s under -race.
//
// Not parallel: its hundred sites would starve the other tests' rounds,
// whose short deadlines then drop their honest sites.
func TestPlusRoundOfManySites(t *testing.T) {
	const n, dim = secagg.DefaultPlusAbove + 1, 8
	w := newWorld(t, n)
	th := serveHost(t, w, HostOptions{}, false) // a hundred sites' bodies: not recorded
	p := w.params("plus-many", dim, w.silos...)
	proto, k, _, err := p.Degree()
	if err != nil {
		t.Fatal(err)
	}
	if proto != secagg.SecAggPlus || k >= n-1 {
		t.Fatalf("a round of %d sites runs %s with %d neighbours a site; want SecAgg+ on a sparse graph", n, proto, k)
	}
	hour := Deadlines{Advertise: time.Hour, Share: time.Hour, Mask: time.Hour, Consistency: time.Hour, Unmask: time.Hour}
	th.open(t, p, hour)
	ctx := t.Context()
	before := []string{"hospital-b", "hospital-050"} // cut before their input leaves
	after := []string{"hospital-c", "hospital-100"}  // cut once their input was accepted
	cables := map[string]*cable{}
	weights := map[string]float64{}
	var runs []*run
	for i, s := range w.silos {
		hc := w.silo(s)
		if slices.Contains(before, s) || slices.Contains(after, s) {
			cab := newCable()
			if slices.Contains(before, s) {
				cab.cutBefore = func(r *http.Request) bool { return endpoint(r, "masked") }
			} else {
				cab.cutAfter = func(r *http.Request, _ *http.Response) bool { return endpoint(r, "masked") }
			}
			cables[s] = cab
			hc = w.client(w.ids[s], w.fed, cab.wrap)
			go func() {
				select {
				case <-cab.cutNow:
					th.Excuse(p.Round, s)
				case <-ctx.Done():
				}
			}()
		}
		weights[s] = float64(i%7 + 1)
		runs = append(runs, participate(ctx, hc, th, p, w.keys[s], testInput(s, dim), weights[s], s))
	}
	res := th.sum(t, ctx, p.Round)
	var want, dropped []string
	var xs [][]float64
	weight := 0.0
	for _, s := range w.silos {
		if slices.Contains(before, s) {
			dropped = append(dropped, s)
			continue
		}
		want = append(want, s)
		xs = append(xs, testInput(s, dim))
		weight += weights[s]
	}
	slices.Sort(want)
	slices.Sort(dropped)
	checkSum(t, res, plainSum(dim, xs...), weight, want, dropped)
	for _, r := range runs {
		cab := cables[r.site]
		if cab == nil {
			if err := r.wait(t); err != nil {
				t.Errorf("%s: %v", r.site, err)
			}
			continue
		}
		<-cab.cutNow
		r.cancel()
		wantCode(t, r.site+", cut off", r.wait(t), diag.SecAggWireGaveUp)
	}
}
