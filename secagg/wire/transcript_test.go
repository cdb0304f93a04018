package wire

import (
	"errors"
	"maps"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/secagg"
)

// TestReplayAgrees: a recorded round with a silo that drops before
// masking (so unmasking removes its pairwise masks too) is replayed from
// its transcript on a server of the replayer's own: the same sum, bit for
// bit, the same weight, contributors and dropped. A transcript with one
// bit of one masked input changed replays to another sum (or not at
// all), and one with an unknown stage is refused.
func TestReplayAgrees(t *testing.T) {
	t.Parallel()
	const dim = 300
	w, th, p := roundOf(t, 5, HostOptions{}, "replay", dim)
	if err := th.OpenRecorded(p, generous(), nil); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cab := newCable()
	cab.cutBefore = func(r *http.Request) bool { return endpoint(r, "masked") }
	runs, _ := startSites(ctx, w, th, p, w.silos, rising(1), map[string]*http.Client{"hospital-b": w.siloVia("hospital-b", cab)})
	// The mask phase ends when hospital-b's deadline passes: generous,
	// so end it by excusing the cut-off site.
	<-cab.cutNow
	th.Excuse(p.Round, "hospital-b")
	res, tr, err := th.WaitRecorded(ctx, p.Round)
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, slices.Delete(slices.Clone(runs), 1, 2))
	runs[1].cancel()
	runs[1].wait(t)
	if len(res.Dropped) != 1 || len(tr.Stages["masked"]) != 4 || len(tr.Stages["advert"]) != 5 {
		t.Fatalf("dropped %v; the transcript holds %d masked inputs and %d adverts", res.Dropped, len(tr.Stages["masked"]), len(tr.Stages["advert"]))
	}
	again, err := Replay(p, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, "the replay", res, again, true)

	// One bit of one masked input: another sum.
	bad := tampered(tr, "masked", "hospital-c", func(b []byte) { b[len(b)-20] ^= 1 })
	if other, err := Replay(p, bad, nil); err == nil {
		sameResult(t, "the replay of a changed masked input", res, other, false)
	}
	// An unknown stage is refused.
	if _, err := Replay(p, tampered(tr, "extra", "hospital-a", nil), nil); err == nil {
		t.Error("a transcript with an unknown stage replayed")
	}
}

// TestReplayForwarded: a recorded round forwards each masked input as the
// host accepts it to a "replaying node" (here an Accumulator in the test)
// that sums them; one forward fails, so the transcript keeps that input's
// bytes and names the others by hash. The replay from the transcript and
// the forwarded sum gives the host's sum bit for bit; a forwarded sum
// missing one input is refused.
func TestReplayForwarded(t *testing.T) {
	t.Parallel()
	const dim = 200
	w, th, p := roundOf(t, 4, HostOptions{}, "replay-forwarded", dim)
	acc, err := secagg.NewAccumulator(p)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hashes := map[string]content.Ref{}
	fwd := func(site string, body []byte) error {
		if site == "hospital-c" {
			return errors.New("the replaying node is unreachable")
		}
		m, err := secagg.ParseMaskedInput(body)
		if err != nil {
			return err
		}
		if err := acc.Add(m); err != nil {
			return err
		}
		mu.Lock()
		hashes[site] = content.Hash(body)
		mu.Unlock()
		return nil
	}
	if err := th.OpenRecorded(p, generous(), fwd); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	runs, _ := startSites(ctx, w, th, p, w.silos, rising(1), nil)
	res, tr, err := th.WaitRecorded(ctx, p.Round)
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, runs)
	if len(tr.Forwarded) != 3 || len(tr.Stages["masked"]) != 1 || tr.Stages["masked"]["hospital-c"] == nil {
		t.Fatalf("forwarded %v, held %d masked inputs; want three forwarded and hospital-c's held", tr.Forwarded, len(tr.Stages["masked"]))
	}
	sum, _ := acc.Sum()
	again, err := Replay(p, tr, &ForwardedSum{Sum: sum, Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, "the replay with forwarded inputs", res, again, true)
	short := maps.Clone(hashes)
	delete(short, "hospital-a")
	if _, err := Replay(p, tr, &ForwardedSum{Sum: sum, Hashes: short}); err == nil {
		t.Error("a forwarded sum missing an input replayed")
	}
	if _, err := Replay(p, tr, nil); err == nil {
		t.Error("a transcript naming forwarded inputs replayed without them")
	}
}

// tampered is a copy of tr with site's message of stage changed by f (or
// added empty when the stage is new).
func tampered(tr *Transcript, stage, site string, f func([]byte)) *Transcript {
	c := &Transcript{Format: tr.Format, Round: tr.Round, Stages: map[string]map[string][]byte{}}
	for k, v := range tr.Stages {
		c.Stages[k] = map[string][]byte{}
		for s, b := range v {
			c.Stages[k][s] = slices.Clone(b)
		}
	}
	if c.Stages[stage] == nil {
		c.Stages[stage] = map[string][]byte{site: {}}
		return c
	}
	f(c.Stages[stage][site])
	return c
}

// sameResult checks that b is (equal) or is not (!equal) a's sum, bit for
// bit; when equal, with the same weight, contributors and dropped.
func sameResult(t *testing.T, what string, a, b *secagg.Result, equal bool) {
	t.Helper()
	same := len(a.Sum) == len(b.Sum)
	for i := 0; same && i < len(a.Sum); i++ {
		same = math.Float64bits(a.Sum[i]) == math.Float64bits(b.Sum[i])
	}
	if same != equal {
		t.Fatalf("%s: sums equal %v, want %v", what, same, equal)
	}
	if equal && (a.Weight != b.Weight || !slices.Equal(a.Contributors, b.Contributors) || !slices.Equal(a.Dropped, b.Dropped) || a.ErrorBound != b.ErrorBound) {
		t.Fatalf("%s: weight %v/%v, contributors %v/%v, dropped %v/%v", what, a.Weight, b.Weight, a.Contributors, b.Contributors, a.Dropped, b.Dropped)
	}
}

// TestReplaySparseRound: a SecAgg+ round on a sparse graph records its
// sites' graph reveals, and the replay enters them where the round did —
// right after the adverts, before key sharing — so it draws the same
// graph and gives the host's sum bit for bit (the reveal stage is listed
// last in the scheme; replaying in list order failed every such round).
func TestReplaySparseRound(t *testing.T) {
	t.Parallel()
	const n, dim = 8, 64
	w, th, p := roundOf(t, n, HostOptions{}, "replay-sparse", dim)
	p.Protocol = secagg.SecAggPlus
	if _, k, _, err := p.Degree(); err != nil || k >= n-1 {
		t.Fatalf("a SecAgg+ round of %d sites has degree %d (%v); want a sparse graph", n, k, err)
	}
	if err := th.OpenRecorded(p, generous(), nil); err != nil {
		t.Fatal(err)
	}
	runs, _ := startSites(t.Context(), w, th, p, w.silos, rising(1), nil)
	res, tr, err := th.WaitRecorded(t.Context(), p.Round)
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, runs)
	if len(tr.Stages[pathReveal]) != n {
		t.Fatalf("the transcript holds %d graph reveals, want %d", len(tr.Stages[pathReveal]), n)
	}
	again, err := Replay(p, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, "the replay of a sparse round", res, again, true)
}
