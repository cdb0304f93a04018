package wire

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// Phase deadlines: long ones are never reached when every site answers
// (a phase ends as soon as nobody is missing); the short one is the
// deadline of the phase a test makes a site miss.
const (
	long  = 20 * time.Second
	short = 2 * time.Second
)

func generous() Deadlines {
	return Deadlines{Advertise: long, Share: long, Mask: long, Consistency: long, Unmask: long}
}

// plainSum is the reference: the sum of the sites' inputs in float64.
func plainSum(dim int, inputs ...[]float64) []float64 {
	s := make([]float64, dim)
	for _, x := range inputs {
		for i, v := range x {
			s[i] += v
		}
	}
	return s
}

// checkSum compares a result with the plain sum within the fixed-point
// bound (plus float64 rounding of the decoded and the reference sums).
func checkSum(t *testing.T, res *secagg.Result, want []float64, weight float64, contributors, dropped []string) {
	t.Helper()
	if len(res.Sum) != len(want) {
		t.Fatalf("sum has %d values, want %d", len(res.Sum), len(want))
	}
	worst := 0.0
	for i := range want {
		worst = max(worst, math.Abs(res.Sum[i]-want[i]))
	}
	if tol := res.ErrorBound + 8*0x1p-52*4; worst > tol {
		t.Errorf("sum differs from the plain sum by up to %g, bound %g", worst, tol)
	}
	if math.Abs(res.Weight-weight) > 1e-9 {
		t.Errorf("weight %v, want %v", res.Weight, weight)
	}
	if !slices.Equal(res.Contributors, contributors) {
		t.Errorf("contributors %v, want %v", res.Contributors, contributors)
	}
	if !slices.Equal(res.Dropped, dropped) {
		t.Errorf("dropped %v, want %v", res.Dropped, dropped)
	}
}

// finishes collects OnFinish calls.
type finishes struct {
	mu   sync.Mutex
	errs map[string]error
	ch   chan string
}

func newFinishes() *finishes { return &finishes{errs: map[string]error{}, ch: make(chan string, 16)} }

func (f *finishes) on(round string, err error) {
	f.mu.Lock()
	f.errs[round] = err
	f.mu.Unlock()
	f.ch <- round
}

func (f *finishes) wait(t *testing.T, round string) error {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r := <-f.ch:
			if r == round {
				f.mu.Lock()
				defer f.mu.Unlock()
				return f.errs[round]
			}
		case <-timeout:
			t.Fatalf("round %q never finished", round)
		}
	}
}

// TestFourSites: four silos, started before the round is even open, sum
// their weighted inputs over mutual TLS; the sum matches the plain sum
// within the fixed-point bound, the weights add up, the reducer is told,
// and the round ID cannot run twice.
func TestFourSites(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	fin := newFinishes()
	th := startHost(t, w, HostOptions{OnFinish: fin.on})
	const dim = 1000
	p := w.params("fl/run 7/round 3 — ✓", dim, w.silos...) // any round ID travels
	ctx := t.Context()

	runs, xs := startSites(ctx, w, th, p, w.silos, rising(10), nil)
	// The sites wait (404, retried) until the reducer peer opens the round.
	th.open(t, p, generous())
	if err := th.Open(p, Deadlines{}); err != nil {
		t.Fatalf("opening the same round again: %v", err)
	}
	other := p
	other.Dim++
	wantCode(t, "opening the round with other params", th.Open(other, generous()), diag.SecAggWireConflict)

	for _, r := range runs {
		if err := r.wait(t); err != nil {
			t.Fatalf("%s: %v", r.site, err)
		}
	}
	if err := fin.wait(t, p.Round); err != nil {
		t.Fatalf("OnFinish: %v", err)
	}
	res := th.sum(t, ctx, p.Round)
	checkSum(t, res, plainSum(dim, xs...), 100, w.silos, nil)

	if _, err := th.Result(p.Round); !errors.Is(err, ErrOver) {
		t.Errorf("taking the result twice: %v, want ErrOver", err)
	}
	wantCode(t, "opening a round that ran", th.Open(p, generous()), diag.SecAggWireRoundOver)
	if _, err := th.Result("never opened"); !errors.Is(err, ErrUnknownRound) {
		t.Errorf("result of an unknown round: %v", err)
	}
}

// TestDropAfterMasking: one silo sends its masked input and then loses
// its link, so it never signs the survivor set nor unmasks. The others' shares
// recover its self mask, and the sum holds all four inputs (its input
// arrived); the round completes at the consistency deadline.
func TestDropAfterMasking(t *testing.T) {
	t.Parallel()
	const dim = 500
	w, th, p := openRound(t, 4, "drop-after-mask", dim, func(dl *Deadlines) {
		dl.Consistency = short // the cut-off site never signs the survivor set
	})
	ctx := t.Context()
	cab := newCable()
	cab.cutAfter = func(r *http.Request, _ *http.Response) bool { return endpoint(r, "masked") }
	runs, xs := startSites(ctx, w, th, p, w.silos, rising(1), map[string]*http.Client{"hospital-d": w.siloVia("hospital-d", cab)})
	res := th.sum(t, ctx, p.Round)
	checkSum(t, res, plainSum(dim, xs...), 10, w.silos, nil)
	waitAll(t, runs[:3])
	<-cab.cutNow
	runs[3].cancel()
	err := runs[3].wait(t)
	wantCode(t, "the cut-off site", err, diag.SecAggWireGaveUp)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("the cut-off site's error does not wrap context.Canceled: %v", err)
	}
}

// TestDropBeforeMasking: one silo shares its keys and then loses its link
// before sending its input; at the mask deadline the others unmask its
// pairwise masks and the sum is of the three others.
func TestDropBeforeMasking(t *testing.T) {
	t.Parallel()
	const dim = 500
	w, th, p := openRound(t, 4, "drop-before-mask", dim, func(dl *Deadlines) { dl.Mask = short })
	ctx := t.Context()
	cab := newCable()
	cab.cutBefore = func(r *http.Request) bool { return endpoint(r, "masked") }
	runs, xs := startSites(ctx, w, th, p, w.silos, rising(1), map[string]*http.Client{"hospital-b": w.siloVia("hospital-b", cab)})
	xs = slices.Delete(xs, 1, 2) // hospital-b's input never arrives
	res := th.sum(t, ctx, p.Round)
	checkSum(t, res, plainSum(dim, xs...), 1+3+4, []string{"hospital-a", "hospital-c", "hospital-d"}, []string{"hospital-b"})
	waitAll(t, slices.Delete(slices.Clone(runs), 1, 2))
	runs[1].cancel()
	wantCode(t, "the cut-off site", runs[1].wait(t), diag.SecAggWireGaveUp)
}

// TestLateSite: a silo whose advert arrives after advertising ended is
// told it is too late (SC6109); the round goes on with the three others.
func TestLateSite(t *testing.T) {
	t.Parallel()
	const dim = 64
	w, th, p := openRound(t, 4, "late", dim, func(dl *Deadlines) { dl.Advertise = short })
	ctx := t.Context()
	gotKeys := make(chan struct{})
	var once sync.Once
	cab := newCable()
	cab.seen = func(r *http.Request, resp *http.Response) {
		if endpoint(r, "keyset") && resp.StatusCode == http.StatusOK {
			once.Do(func() { close(gotKeys) })
		}
	}
	runs, xs := startSites(ctx, w, th, p, w.silos[:3], flat(1), map[string]*http.Client{"hospital-a": w.siloVia("hospital-a", cab)})
	<-gotKeys // advertising has ended
	err := Participate(ctx, w.silo("hospital-d"), th.url, p, w.keys["hospital-d"], testInput("hospital-d", dim), 1)
	wantCode(t, "the late site", err, diag.SecAggWireTooLate)
	waitAll(t, runs)
	res := th.sum(t, ctx, p.Round)
	checkSum(t, res, plainSum(dim, xs...), 3, w.silos[:3], nil)
}

// TestTooFewSites: a round of two silos is refused by the host and by the
// silos themselves before anything is sent; a round of four in which only
// two advertise ends with the three-site diagnostic, which both waiting
// sites and the reducer receive.
func TestTooFewSites(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	fin := newFinishes()
	th := startHost(t, w, HostOptions{OnFinish: fin.on})
	ctx := t.Context()

	two := w.params("two", 8, w.silos[:2]...)
	wantCode(t, "opening a round of two", th.Open(two, generous()), diag.SecAggTooFewSites)
	sent := 0
	cab := newCable()
	cab.cutBefore = func(*http.Request) bool { sent++; return false }
	hc := w.siloVia("hospital-a", cab)
	wantCode(t, "a silo in a round of two", Participate(ctx, hc, th.url, two, w.keys["hospital-a"], make([]float64, 8), 1), diag.SecAggTooFewSites)
	if sent != 0 {
		t.Errorf("a silo sent %d requests for a round of two", sent)
	}

	p := w.params("two-of-four", 8, w.silos...)
	dl := generous()
	dl.Advertise = short
	th.open(t, p, dl)
	var runs []*run
	for _, s := range w.silos[:2] {
		runs = append(runs, participate(ctx, w.silo(s), th, p, w.keys[s], make([]float64, 8), 1, s))
	}
	for _, r := range runs {
		wantCode(t, r.site, r.wait(t), diag.SecAggTooFewSites)
	}
	wantCode(t, "OnFinish", fin.wait(t, p.Round), diag.SecAggTooFewSites)
	_, err := th.Wait(ctx, p.Round)
	wantCode(t, "the reducer", err, diag.SecAggTooFewSites)
}

// TestBadInputStaysHome: an input out of the clip range is refused before
// any request leaves the site.
func TestBadInputStaysHome(t *testing.T) {
	w, th, p := roundOf(t, 3, HostOptions{}, "bad-input", 4)
	sent := 0
	cab := newCable()
	cab.cutBefore = func(*http.Request) bool { sent++; return false }
	hc := w.siloVia("hospital-a", cab)
	err := Participate(t.Context(), hc, th.url, p, w.keys["hospital-a"], []float64{0, 2, 0, 0}, 1)
	wantCode(t, "an input outside the clip", err, diag.SecAggOutOfRange)
	err = Participate(t.Context(), hc, th.url, p, w.keys["hospital-a"], []float64{0, math.NaN(), 0, 0}, 1)
	wantCode(t, "a NaN input", err, diag.SecAggOutOfRange)
	if sent != 0 {
		t.Errorf("%d requests left the site", sent)
	}
}

// exchange sends one raw request and returns the status and the first
// diagnostic code of a refusal.
func exchange(t *testing.T, hc *http.Client, method, url, ctype string, body []byte) (int, diag.Code) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var d struct{ Diagnostics diag.List }
	if json.Unmarshal(b, &d) == nil && len(d.Diagnostics) > 0 {
		return resp.StatusCode, d.Diagnostics[0].Code
	}
	return resp.StatusCode, ""
}

func roundURL(th *testHost, round, path string) string {
	return th.url + pathRounds + base64.RawURLEncoding.EncodeToString([]byte(round)) + "/" + path
}

// TestOnlyAsItself: a silo can post only as itself and fetch only its own
// delivery; a federation member outside the round can fetch nothing; a
// retried message is accepted once; bodies are typed and bounded.
func TestOnlyAsItself(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 5)
	th := startHost(t, w, HostOptions{LongPoll: 50 * time.Millisecond})
	p := w.params("as-itself", 16, w.silos[:4]...)
	th.open(t, p, generous())
	advert := func(site string) []byte {
		c, err := secagg.NewClient(p, site, w.keys[site])
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Advertise()
		if err != nil {
			t.Fatal(err)
		}
		b, err := a.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := w.silo("hospital-a"), w.silo("hospital-b")
	url := func(path string) string { return roundURL(th, p.Round, path) }
	cases := []struct {
		name   string
		hc     *http.Client
		method string
		path   string
		ctype  string
		body   []byte
		status int
		code   diag.Code
	}{
		{"a posts b's advert (validly signed by b)", a, "POST", "advert", contentCBOR, advert("hospital-b"), 403, diag.SecAggWireForbidden},
		{"a fetches b's delivery", a, "GET", "deliveries/hospital-b", "", nil, 403, diag.SecAggWireForbidden},
		{"a silo outside the round", w.silo("hospital-e"), "GET", "keyset", "", nil, 403, diag.SecAggWireForbidden},
		{"a worker posts", w.client(w.ids["w1"], w.fed, nil), "POST", "advert", contentCBOR, advert("hospital-a"), 403, diag.SecAggWireForbidden},
		{"the aggregator asks for the key set", w.client(w.agg, w.fed, nil), "GET", "keyset", "", nil, 403, diag.SecAggWireForbidden},
		{"an advert as JSON", a, "POST", "advert", "application/json", []byte("{}"), 415, diag.SecAggWireBadRequest},
		{"an oversized advert", a, "POST", "advert", contentCBOR, make([]byte, 64<<10), 413, diag.SecAggWireBadRequest},
		{"a malformed advert", a, "POST", "advert", contentCBOR, []byte{0xa0}, 400, diag.SecAggMalformed},
		{"no such endpoint", a, "GET", "sums", "", nil, 404, diag.SecAggWireBadRequest},
		{"the key set before advertising ends", b, "GET", "keyset", "", nil, 204, ""},
	}
	for _, c := range cases {
		status, code := exchange(t, c.hc, c.method, url(c.path), c.ctype, c.body)
		if status != c.status || code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, status, code, c.status, c.code)
		}
	}
	if status, code := exchange(t, a, "GET", roundURL(th, "no such round", "keyset"), "", nil); status != 404 || code != diag.SecAggWireNoRound {
		t.Errorf("unknown round: %d %s", status, code)
	}
	if status, _ := exchange(t, a, "GET", th.url+pathRounds+"!!/keyset", "", nil); status != 400 {
		t.Errorf("round not in base64url: %d", status)
	}

	// A retry of a message that arrived is accepted again; another
	// message in its place is refused.
	mine := advert("hospital-a")
	for range 2 {
		if status, code := exchange(t, a, "POST", url("advert"), contentCBOR, mine); status != 204 {
			t.Fatalf("posting a's advert: %d %s", status, code)
		}
	}
	if status, code := exchange(t, a, "POST", url("advert"), contentCBOR, advert("hospital-a")); status != 400 || code != diag.SecAggDuplicate {
		t.Errorf("a second, different advert: %d %s", status, code)
	}
	// Nothing posted as another site reached the server: it waits for
	// everyone but a.
	if err := th.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNonMemberCannotConnect: a key outside the federation fails the TLS
// handshake; nothing reaches the host, and the site gives up at once
// rather than retrying.
func TestNonMemberCannotConnect(t *testing.T) {
	w, th, p := openRound(t, 3, "outsider", 4, nil)
	hc := w.client(w.outsider, w.forged, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := FetchResult(ctx, hc, th.url, p)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("outsider: %v (context: %v), want a refused TLS handshake", err, ctx.Err())
	}
	th.mu.Lock()
	n := len(th.bodies)
	th.mu.Unlock()
	if n != 0 {
		t.Errorf("%d requests of the outsider reached the host", n)
	}
}

// TestResultOverHTTP: sites and aggregators may read the sum (CBOR, or
// JSON for people) until the reducer takes it; a worker may not.
func TestResultOverHTTP(t *testing.T) {
	t.Parallel()
	const dim = 32
	w, th, p := openRound(t, 3, "result", dim, nil)
	ctx := t.Context()
	runs, xs := startSites(ctx, w, th, p, w.silos, flat(2), nil)
	got, err := FetchResult(ctx, w.silo("hospital-a"), th.url, p) // waits for the round
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, got, plainSum(dim, xs...), 6, w.silos, nil)
	if _, err := FetchResult(ctx, w.client(w.agg, w.fed, nil), th.url, p); err != nil {
		t.Errorf("an aggregator fetching the result: %v", err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", roundURL(th, p.Round, "result"), nil)
	req.Header.Set("Accept", "application/json")
	resp, err := w.silo("hospital-b").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var js resultJSON
	err = json.NewDecoder(resp.Body).Decode(&js)
	resp.Body.Close()
	if err != nil || !slices.Equal(js.Sum, got.Sum) || js.Weight != got.Weight {
		t.Errorf("JSON result: %v, %+v", err, js)
	}
	if status, code := exchange(t, w.client(w.ids["w1"], w.fed, nil), "GET", roundURL(th, p.Round, "result"), "", nil); status != 403 {
		t.Errorf("a worker reading the result: %d %s", status, code)
	}
	res, err := th.Wait(ctx, p.Round)
	if err != nil || !slices.Equal(res.Sum, got.Sum) {
		t.Fatalf("reducer: %v", err)
	}
	_, err = FetchResult(ctx, w.silo("hospital-a"), th.url, p)
	wantCode(t, "reading a taken result", err, diag.SecAggWireRoundOver)
	waitAll(t, runs)
}

// TestHostClose: closing the host ends its open rounds with SC6107, which
// waiting sites receive.
func TestHostClose(t *testing.T) {
	w := newWorld(t, 4)
	fin := newFinishes()
	th := startHost(t, w, HostOptions{OnFinish: fin.on})
	p := w.params("closing", 8, w.silos...)
	th.open(t, p, generous())
	ctx := t.Context()
	waiting := make(chan struct{})
	var once sync.Once
	cab := newCable()
	cab.cutBefore = func(r *http.Request) bool {
		if endpoint(r, "keyset") {
			once.Do(func() { close(waiting) })
		}
		return false
	}
	r := participate(ctx, w.siloVia("hospital-a", cab), th, p, w.keys["hospital-a"], make([]float64, 8), 1, "hospital-a")
	<-waiting
	th.Close()
	wantCode(t, "a waiting site", r.wait(t), diag.SecAggWireUnavailable)
	wantCode(t, "OnFinish", fin.wait(t, p.Round), diag.SecAggWireUnavailable)
	wantCode(t, "opening on a closed host", th.Open(w.params("after", 8, w.silos...), generous()), diag.SecAggWireUnavailable)
}

// TestExcusedSite: a site that declined the round is excused, so the
// round ends advertising without waiting for the (here: hour-long) deadline.
func TestExcusedSite(t *testing.T) {
	t.Parallel()
	const dim = 50
	w, th, p := openRound(t, 4, "excused", dim, func(dl *Deadlines) { dl.Advertise = time.Hour })
	ctx := t.Context()
	var runs []*run
	var xs [][]float64
	for i, s := range w.silos {
		if s == "hospital-b" {
			continue
		}
		xs = append(xs, testInput(s, dim))
		runs = append(runs, participate(ctx, w.silo(s), th, p, w.keys[s], testInput(s, dim), float64(i+1), s))
	}
	th.Excuse(p.Round, "hospital-b")
	res := th.sum(t, ctx, p.Round)
	// It never advertised, so it is not among the dropped: it was never in.
	checkSum(t, res, plainSum(dim, xs...), 1+3+4, []string{"hospital-a", "hospital-c", "hospital-d"}, nil)
	waitAll(t, runs)
}

// TestLongPollsBoundedPerSite: a site holds at most maxPolls GETs open on
// a round (a member cannot pin the host's goroutines and memory with held
// polls); the next is refused with SC6110, and the places come back when
// the polls end.
func TestLongPollsBoundedPerSite(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	th := startHost(t, w, HostOptions{LongPoll: time.Hour})
	p := w.params("poll-bound", 16, w.silos[:3]...)
	th.open(t, p, generous())
	th.mu.Lock()
	rd := th.rounds[p.Round]
	th.mu.Unlock()
	held := func() int {
		rd.mu.Lock()
		defer rd.mu.Unlock()
		return rd.polls["hospital-a"]
	}
	waitHeld := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); held() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d long polls held, want %d", held(), n)
			}
		}
	}
	a := w.silo("hospital-a")
	ctx, cancel := context.WithCancel(t.Context())
	ended := make(chan struct{}, maxPolls)
	for range maxPolls {
		go func() {
			defer func() { ended <- struct{}{} }()
			req, _ := http.NewRequestWithContext(ctx, "GET", roundURL(th, p.Round, "keyset"), nil)
			if resp, err := a.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitHeld(maxPolls)
	if status, code := exchange(t, a, "GET", roundURL(th, p.Round, "keyset"), "", nil); status != 429 || code != diag.SecAggWireBusy {
		t.Errorf("a long poll beyond the site's bound: %d %s", status, code)
	}
	// Another site is not held back by hospital-a's polls.
	if status, code := exchange(t, w.silo("hospital-b"), "GET", roundURL(th, p.Round, "deliveries/hospital-a"), "", nil); code == diag.SecAggWireBusy {
		t.Errorf("hospital-b refused for hospital-a's polls: %d %s", status, code)
	}
	cancel()
	for range maxPolls {
		<-ended
	}
	waitHeld(0)
}
