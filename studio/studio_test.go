package studio

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
)

type world struct {
	fed  *identity.Federation
	keys map[string]*identity.Identity
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{keys: map[string]*identity.Identity{}}
	var b strings.Builder
	b.WriteString("federation: t\nregime: consortium\nmembers:\n")
	for i, m := range []struct{ name, role string }{{"agg-1", "aggregator"}, {"h1", "silo"}, {"h2", "silo"}, {"alice", "researcher"}} {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		w.keys[m.name] = id
		fmt.Fprintf(&b, "  - name: %s\n    role: %s\n    public_key: %s\n", m.name, m.role, id.Public())
		if m.role == "aggregator" {
			fmt.Fprintf(&b, "    address: 127.0.0.1:%d\n    raft_address: 127.0.0.1:%d\n", 7000+i, 7100+i)
		}
	}
	fed, err := identity.ParseFederation("fed.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	w.fed = fed
	return w
}

func (w *world) token(t *testing.T, name string, ttl time.Duration, now time.Time) string {
	t.Helper()
	tok, _, err := IssueToken(w.keys[name], w.fed, ttl, now)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestViewerTokens(t *testing.T) {
	w := newWorld(t)
	now := time.Now()
	tok := w.token(t, "h1", 8*time.Hour, now)
	m, c, err := VerifyToken(tok, w.fed, now.Add(time.Hour))
	if err != nil || m.Name != "h1" || c.Member != "h1" {
		t.Fatalf("a fresh token: %v %v %v", m, c, err)
	}
	if _, _, err := VerifyToken(tok, w.fed, now.Add(8*time.Hour+time.Second)); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("an expired token: %v", err)
	}
	if _, _, err := IssueToken(w.keys["h1"], w.fed, 25*time.Hour, now); !errors.Is(err, ErrTokenTTL) {
		t.Fatalf("a 25 h token was issued: %v", err)
	}
	// Claims edited to name another member: the signature no longer holds.
	body, sig, _ := strings.Cut(strings.TrimPrefix(tok, tokenPrefix), ".")
	var cl Claims
	raw, _ := b64.DecodeString(body)
	json.Unmarshal(raw, &cl)
	cl.Member = "h2"
	edited, _ := json.Marshal(cl)
	if _, _, err := VerifyToken(tokenPrefix+b64.EncodeToString(edited)+"."+sig, w.fed, now); !errors.Is(err, ErrTokenForged) {
		t.Fatalf("a token edited to name h2: %v", err)
	}
	// Signed by h2's key but claiming h1: forged.
	cl.Member = "h1"
	claims, _ := json.Marshal(cl)
	other := identity.Sign(w.keys["h2"], identity.PurposeViewerToken, claims)
	if _, _, err := VerifyToken(tokenPrefix+b64.EncodeToString(claims)+"."+b64.EncodeToString(other), w.fed, now); !errors.Is(err, ErrTokenForged) {
		t.Fatalf("a token signed by another member's key: %v", err)
	}
	// A signature for another purpose never verifies as a viewer token.
	wrong := identity.Sign(w.keys["h1"], identity.PurposeReceipt, claims)
	if _, _, err := VerifyToken(tokenPrefix+b64.EncodeToString(claims)+"."+b64.EncodeToString(wrong), w.fed, now); !errors.Is(err, ErrTokenForged) {
		t.Fatalf("a receipt signature passed as a viewer token: %v", err)
	}
	for _, bad := range []string{"", "sv1.", "sv1.x.y", "bearer", tok + "x", strings.Repeat("a", 5000)} {
		if _, _, err := VerifyToken(bad, w.fed, now); err == nil {
			t.Fatalf("malformed token %q verified", bad)
		}
	}
	// A token for a key that is not in the federation cannot be issued.
	stranger, _ := identity.Generate()
	if _, _, err := IssueToken(stranger, w.fed, time.Hour, now); !errors.Is(err, ErrTokenMember) {
		t.Fatalf("a stranger's token: %v", err)
	}
}

// A member's own signed token whose life wraps time.Duration (2^64 ns
// past a whole number of seconds: 18,446,744,074 s, about 584 years) or
// whose times are negative is refused (ErrTokenTTL). Before, the
// life multiplied into a Duration wrapped to 0.29 s, under MaxTTL, and
// the token was accepted for 584 years.
func TestViewerTokenLifeOverflow(t *testing.T) {
	w := newWorld(t)
	now := time.Now()
	sign := func(c Claims) string {
		body, _ := json.Marshal(c)
		return tokenPrefix + b64.EncodeToString(body) + "." + b64.EncodeToString(identity.Sign(w.keys["h1"], identity.PurposeViewerToken, body))
	}
	at := now.Unix()
	for _, c := range []Claims{
		{Member: "h1", Issued: at, Expiry: at + 18446744074},
		{Member: "h1", Issued: at, Expiry: math.MaxInt64},
		{Member: "h1", Issued: math.MinInt64 + 1, Expiry: at + 3600},
		{Member: "h1", Issued: -1, Expiry: at + 3600},
		{Member: "h1", Issued: at, Expiry: at + int64(MaxTTL/time.Second) + 1},
	} {
		if _, _, err := VerifyToken(sign(c), w.fed, now.Add(48*time.Hour)); !errors.Is(err, ErrTokenTTL) {
			t.Errorf("iat %d exp %d, checked two days later: %v, want ErrTokenTTL", c.Issued, c.Expiry, err)
		}
	}
	c := Claims{Member: "h1", Issued: at, Expiry: at + int64(MaxTTL/time.Second)}
	if _, _, err := VerifyToken(sign(c), w.fed, now.Add(time.Hour)); err != nil {
		t.Errorf("a token of exactly MaxTTL: %v", err)
	}
}

// fakeSource is a state with one sweep job of four shards (two verified)
// and the contribution records of one training run are left out: the
// picture's job and grid logic is what is under test here.
type fakeSource struct {
	jobs   []coordinator.JobStatus
	runs   []coordinator.RunStatus
	blobs  map[content.Ref][]byte
	params []map[string]any
	events chan coordinator.Event
}

func (f *fakeSource) Jobs() []coordinator.JobStatus { return f.jobs }
func (f *fakeSource) Job(id content.Ref) (coordinator.JobStatus, error) {
	for _, j := range f.jobs {
		if j.ID == id {
			return j, nil
		}
	}
	return coordinator.JobStatus{}, errors.New("no job")
}
func (f *fakeSource) Runs() []coordinator.RunStatus     { return f.runs }
func (f *fakeSource) Receipts(uint64) []receipt.Receipt { return nil }
func (f *fakeSource) Contributions() map[string]int64   { return map[string]int64{"h1": 2} }
func (f *fakeSource) Cluster() Cluster {
	return Cluster{Node: "agg-1", State: "leader", Leader: "agg-1"}
}
func (f *fakeSource) Subscribe() (<-chan coordinator.Event, func()) { return f.events, func() {} }
func (f *fakeSource) Blob(_ context.Context, ref content.Ref) ([]byte, error) {
	if b, ok := f.blobs[ref]; ok {
		return b, nil
	}
	return nil, errors.New("no blob")
}
func (f *fakeSource) Plan(context.Context, coordinator.JobStatus) (Plan, error) {
	return Plan{Params: f.params, Metric: "auc", Goal: "max"}, nil
}

func newFake(t *testing.T) *fakeSource {
	f := &fakeSource{blobs: map[content.Ref][]byte{}, events: make(chan coordinator.Event)}
	js := coordinator.JobStatus{ID: content.Hash([]byte("job")), Name: "sweep", State: coordinator.JobRunning, Regime: "consortium"}
	for i, p := range [][2]float64{{0.1, 0}, {0.2, 0}, {0.1, 1}, {0.2, 1}} {
		f.params = append(f.params, map[string]any{"lr": p[0], "l2": p[1]})
		s := coordinator.ShardStatus{Index: i, State: coordinator.StatePending}
		if i < 2 {
			b, err := content.Encode(map[string]any{"auc": 0.6 + 0.1*float64(i)})
			if err != nil {
				t.Fatal(err)
			}
			s.State, s.Result, s.DecidedAt = coordinator.StateVerified, content.Hash(b), 1000
			f.blobs[s.Result] = b
		}
		js.Shards = append(js.Shards, s)
	}
	f.jobs = []coordinator.JobStatus{js}
	return f
}

func TestStudioRefusesAndServes(t *testing.T) {
	w := newWorld(t)
	srv := NewServer(newFake(t), w.fed, nil)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	now := time.Now()
	get := func(path, tok string) (int, string) {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		bufio.NewReader(res.Body).WriteTo(&b)
		return res.StatusCode, b.String()
	}
	expired, _, _ := IssueToken(w.keys["h1"], w.fed, time.Hour, now.Add(-2*time.Hour))
	h1 := w.token(t, "h1", time.Hour, now)
	forged := strings.Replace(h1, ".", ".x", 1)
	for _, c := range []struct {
		what, path, tok string
		code            int
		has             string
	}{
		{"no token", "/api/picture", "", 401, "SC7401"},
		{"no token, page", "/", "", 401, "SC7401"},
		{"expired", "/api/picture", expired, 401, "SC7402"},
		{"forged", "/api/events", forged, 401, "SC7402"},
		{"another silo's ledger", "/api/ledger/h2", h1, 403, "SC7403"},
		{"a researcher asking h1's ledger", "/api/ledger/h1", w.token(t, "alice", time.Hour, now), 403, "SC7403"},
		{"own ledger", "/api/ledger/h1", h1, 200, "[]"},
		{"picture", "/api/picture", h1, 200, `"metric":"auc"`},
		{"assets are public", "/assets/app.js", "", 200, "EventSource"},
	} {
		code, body := get(c.path, c.tok)
		if code != c.code || !strings.Contains(body, c.has) {
			t.Errorf("%s: %s answered %d, want %d with %q:\n%s", c.what, c.path, code, c.code, c.has, body)
		}
	}
	// The grid: two cells of four filled, the better one marked best.
	_, body := get("/api/picture", h1)
	var p Picture
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	g := p.Jobs[0].Grid
	if g == nil || len(g.Cells) != 4 || g.Best != 1 || g.Cells[0].Value == nil || g.Cells[2].Value != nil || g.XName != "l2" || g.YName != "lr" {
		t.Fatalf("grid: %+v", g)
	}
	if p.Viewer.Member != "h1" || p.Viewer.Via != "token" {
		t.Fatalf("viewer: %+v", p.Viewer)
	}
}

// The browser's sign-in: the URL's token becomes an HttpOnly cookie and
// leaves the address bar.
func TestStudioTokenURLSetsCookie(t *testing.T) {
	w := newWorld(t)
	srv := NewServer(newFake(t), w.fed, nil)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	client := ts.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err := client.Get(ts.URL + "/?token=" + w.token(t, "alice", time.Hour, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	ck := res.Cookies()
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" || len(ck) != 1 || !ck[0].HttpOnly || !ck[0].Secure {
		t.Fatalf("sign-in answered %d %q cookies %v", res.StatusCode, res.Header.Get("Location"), ck)
	}
	res, err = client.Get(ts.URL + "/?token=sv1.bad.token")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 || len(res.Cookies()) != 0 {
		t.Fatalf("a bad token in the URL answered %d and cookies %v", res.StatusCode, res.Cookies())
	}
}

// In an open pool a job's result values are for its submitter and
// operators only, as on the blob endpoint: other viewers see which cells
// are verified, not their values.
func TestStudioHidesOpenPoolValues(t *testing.T) {
	f := newFake(t)
	f.jobs[0].Regime, f.jobs[0].Submitter = "open", "alice"
	w := newWorld(t)
	full := newCache(w.fed, nil).build(context.Background(), f)
	h1, _ := w.fed.Member("h1")
	alice, _ := w.fed.Member("alice")
	other := full.forViewer(Viewer{Member: "h1"}, h1)
	mine := full.forViewer(Viewer{Member: "alice"}, alice)
	if g := other.Jobs[0].Grid; !other.Jobs[0].Hidden || g.Best != -1 || g.Cells[0].Value != nil || g.Cells[0].State != "verified" {
		t.Fatalf("h1 sees an open-pool job's values: %+v", g)
	}
	if g := mine.Jobs[0].Grid; mine.Jobs[0].Hidden || g.Cells[0].Value == nil {
		t.Fatalf("the submitter does not see her values: %+v", g)
	}
	if full.Jobs[0].Grid.Cells[0].Value == nil {
		t.Fatal("cutting a viewer's picture changed the full one")
	}
}

// A member holds at most MaxStreams event streams at once: the next is
// refused (SC7404), another member is not, and a stream that ends gives
// its place back.
func TestStudioBoundsStreamsPerMember(t *testing.T) {
	w := newWorld(t)
	srv := NewServer(newFake(t), w.fed, nil)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	now := time.Now()
	open := func(ctx context.Context, member string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/events", nil)
		req.Header.Set("Authorization", "Bearer "+w.token(t, member, time.Hour, now))
		res, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	ctx, cancel := context.WithCancel(context.Background())
	var held []*http.Response
	for range MaxStreams {
		res := open(ctx, "h1")
		if res.StatusCode != 200 {
			t.Fatalf("stream %d: %d", len(held), res.StatusCode)
		}
		held = append(held, res)
	}
	res := open(context.Background(), "h1")
	var b strings.Builder
	bufio.NewReader(res.Body).WriteTo(&b)
	res.Body.Close()
	if res.StatusCode != 429 || !strings.Contains(b.String(), "SC7404") {
		t.Fatalf("a stream beyond the bound: %d %s", res.StatusCode, b.String())
	}
	other := open(ctx, "alice")
	if other.StatusCode != 200 {
		t.Fatalf("another member's stream: %d", other.StatusCode)
	}
	held[0].Body.Close()
	waitFor := time.Now().Add(20 * time.Second)
	for {
		srv.streamsMu.Lock()
		n := srv.streams["h1"]
		srv.streamsMu.Unlock()
		if n < MaxStreams {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatal("a closed stream kept its place")
		}
		time.Sleep(time.Millisecond)
	}
	if res := open(ctx, "h1"); res.StatusCode != 200 {
		t.Fatalf("a stream after one closed: %d", res.StatusCode)
	}
	cancel()
}

// put stores v as a blob and returns its hash.
func (f *fakeSource) put(t *testing.T, v any) content.Ref {
	t.Helper()
	b, err := content.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	f.blobs[content.Hash(b)] = b
	return content.Hash(b)
}

// A DP run whose round 0 was retried: the run view takes each step from
// the job its round result names (the abandoned attempt, first in the
// job list, shows no decline for a step h1 contributed to), counts h1's
// charge once, and says why it draws no curve — under DP a training round
// releases no loss and this run declares no evaluation — instead of
// drawing empty axes.
func TestStudioRunFromTheAccount(t *testing.T) {
	w := newWorld(t)
	f := newFake(t)
	spec := fl.Canonical{Spec: fl.RunSpec{Name: "dp", DP: true}}
	run := f.put(t, spec)
	record := func(job content.Ref, status string) content.Ref {
		c := silo.Contribution{Format: silo.ContributionFormat, Run: run, Round: 0, Job: job, Silo: "h1", Dataset: "patients", Status: status,
			LedgerEntry: content.Hash([]byte("h1 round 0")), Mechanisms: []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}, Epsilon: 0.5, Delta: 1e-5, Cumulative: 0.5, Budget: 8}
		sc, err := silo.Sign(w.keys["h1"], c)
		if err != nil {
			t.Fatal(err)
		}
		return f.put(t, sc)
	}
	abandoned, retry := content.Hash([]byte("attempt a")), content.Hash([]byte("attempt b"))
	shard := func(res content.Ref) []coordinator.ShardStatus {
		return []coordinator.ShardStatus{{State: coordinator.StateVerified, Result: res, Receipt: 1}}
	}
	f.jobs = append(f.jobs,
		coordinator.JobStatus{ID: abandoned, Run: run, State: coordinator.JobAbandoned, Shards: shard(record(abandoned, silo.Failed))},
		coordinator.JobStatus{ID: retry, Run: run, State: coordinator.JobDone, Shards: shard(record(retry, silo.Contributed))})
	g, err := fl.Global{"w": []float64{1}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	model := f.put(t, fl.RoundResult{Format: fl.RoundResultFormat, Run: run, Job: retry, Model: content.Hash(g), Global: g,
		Metrics: map[string]float64{}, Participants: []string{"h1"}, Dropped: []string{}})
	f.runs = []coordinator.RunStatus{{ID: run, Name: "dp", Rounds: 2, State: coordinator.RunRunning, Jobs: []content.Ref{abandoned, retry}, Models: []content.Ref{model}}}

	full := newCache(w.fed, nil).build(context.Background(), f)
	rv := full.Runs[0]
	if len(rv.Done) != 1 || len(rv.Done[0].Declined) != 0 || rv.Done[0].Epsilon["h1"] != 0.5 {
		t.Fatalf("step 0: %+v, want h1 charged 0.5 and no decline", rv.Done)
	}
	if !strings.Contains(rv.CurveNote, "declares no charged evaluation") || rv.Done[0].TrainLoss != nil {
		t.Fatalf("the DP run's curve note: %q (train loss %v)", rv.CurveNote, rv.Done[0].TrainLoss)
	}
	if len(full.Privacy) != 1 || full.Privacy[0].Charges != 1 || full.Privacy[0].Cumulative != 0.5 || !full.Privacy[0].Verified {
		t.Fatalf("privacy rows: %+v, want h1's one charge", full.Privacy)
	}
	if n := len(full.ledgerOf("h1")); n != 2 {
		t.Fatalf("h1's own ledger view lists %d records, want both attempts'", n)
	}
}

// A silo's refusal codes and messages (why it declined a round) reach its
// own viewer only; another silo, a researcher or an operator sees that it
// declined, not why. Before, every viewer saw every silo's codes.
func TestDeclineReasonsOnlyForTheSilo(t *testing.T) {
	w := newWorld(t)
	f := &full{Picture: Picture{Runs: []RunView{{Done: []RoundView{{Round: 1, Declined: map[string]string{
		"h1": "SC9201 the round's noise is below this silo's policy", "h2": "failed"}}}}}}}
	for viewer, want := range map[string]string{"h1": "SC9201 the round's noise is below this silo's policy", "h2": "declined", "alice": "declined"} {
		m, _ := w.fed.Member(viewer)
		got := f.forViewer(Viewer{Member: viewer}, m).Runs[0].Done[0].Declined
		if got["h1"] != want || got["h2"] != "failed" {
			t.Errorf("%s sees %v, want h1 %q and h2 failed", viewer, got, want)
		}
	}
	if f.Runs[0].Done[0].Declined["h1"] == "declined" {
		t.Error("cutting a viewer's picture changed the full one")
	}
}
