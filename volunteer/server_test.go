package volunteer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/volunteer/proof"
)

// machineBackend runs the volunteer API over a real coordinator state
// machine in memory (the aggregator puts Raft between them).
type machineBackend struct {
	mu    sync.Mutex
	m     *coordinator.Machine
	blobs map[content.Ref][]byte
}

func (b *machineBackend) Apply(_ context.Context, c coordinator.Command) (api.Applied, error) {
	res := b.m.Apply(c)
	if res.Refused() {
		return api.Applied{Refusal: res.Refusal}, nil
	}
	raw, err := json.Marshal(res.Response)
	return api.Applied{Response: raw}, err
}
func (b *machineBackend) Regime() trust.Regime          { return b.m.Regime() }
func (b *machineBackend) Jobs() []coordinator.JobStatus { return b.m.Jobs() }
func (b *machineBackend) Job(id content.Ref) (coordinator.JobStatus, error) {
	return b.m.Job(id)
}
func (b *machineBackend) RevealOpen(j content.Ref, s int, now int64) (bool, int64) {
	return b.m.RevealOpen(j, s, now)
}
func (b *machineBackend) Leasable(peer string, now int64) int { return b.m.Leasable(peer, now) }
func (b *machineBackend) Blob(_ context.Context, ref content.Ref) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.blobs[ref]; ok {
		return d, nil
	}
	return nil, errors.New("no such blob")
}
func (b *machineBackend) PutBlob(_ context.Context, d []byte) (content.Ref, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ref := content.Hash(d)
	b.blobs[ref] = d
	return ref, nil
}

// rig is a volunteer server over a machine of regime, with fake wasm
// files (the page is not loaded here).
func rig(t *testing.T, regime trust.Regime, opt Options) (*machineBackend, *httptest.Server) {
	t.Helper()
	m, err := coordinator.New(coordinator.Config{Regime: regime, DefaultLeaseTTL: 60000, SignedReports: true})
	if err != nil {
		t.Fatal(err)
	}
	be := &machineBackend{m: m, blobs: map[content.Ref][]byte{}}
	dir := t.TempDir()
	opt.Wasm = filepath.Join(dir, "scellis.wasm")
	for _, f := range []string{"scellis.wasm", "wasm_exec.js"} {
		os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644)
	}
	s, err := New(be, opt, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return be, srv
}

// call posts body (JSON) to path with token and decodes the answer into
// out, or returns the first diagnostic's code.
func call(t *testing.T, srv *httptest.Server, method, path, token string, body, out any) diag.Code {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, srv.URL+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var body struct{ Diagnostics []diag.Diagnostic }
		err := json.NewDecoder(res.Body).Decode(&body)
		ds := body.Diagnostics
		if err != nil || len(ds) == 0 {
			t.Fatalf("%s %s: %d without diagnostics", method, path, res.StatusCode)
		}
		if ds[0].Message == "" || ds[0].Help == "" && ds[0].Code != diag.PoolNoLease {
			t.Errorf("%s %s: diagnostic %s says too little: %+v", method, path, ds[0].Code, ds[0])
		}
		return ds[0].Code
	}
	if out != nil {
		json.NewDecoder(res.Body).Decode(out)
	}
	return ""
}

type tab struct {
	priv ed25519.PrivateKey
	key  string
}

func newTab(seed byte) tab {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	return tab{priv, receipt.KeyPrefix + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))}
}

func (tb tab) solve(c Challenge) JoinRequest {
	sig, _ := tb.priv.Sign(nil, proof.JoinMessage(c.Challenge, tb.key), &ed25519.Options{Context: proof.PurposeJoin})
	return JoinRequest{Key: tb.key, Challenge: c.Challenge, Nonce: strconv.FormatUint(proof.Solve(c.Challenge, tb.key, c.Difficulty), 10), Sig: base64.StdEncoding.EncodeToString(sig)}
}

// The join endpoint and the work API refuse bad input with diagnostics:
// a wrong proof of work, a join signed by another key, a challenge for
// another key, a replayed one, a flood from one address, no or a forged
// session token, a result for a shard not leased, a lease past the
// volunteer's cap (MaxLeases); a job with input tables is neither shown
// nor leased; a consortium pool takes
// no volunteers. A good join gets a session whose peer is the key's
// volunteer name, and it can lease and report an open job's shard.
func TestJoinAndWorkRefusals(t *testing.T) {
	be, srv := rig(t, trust.Open, Options{Difficulty: 8, JoinsPerMinute: 60, JoinBurst: 6, MaxLeases: 1})
	alice, bob := newTab(1), newTab(2)
	var c Challenge
	if code := call(t, srv, "POST", "/volunteer/v1/challenge", "", ChallengeRequest{Key: alice.key}, &c); code != "" || c.Difficulty != 8 {
		t.Fatalf("challenge: %s %+v", code, c)
	}
	good := alice.solve(c)
	badWork := good
	for n := uint64(0); ; n++ { // a nonce that does not solve it
		if !proof.Check(c.Challenge, alice.key, n, 8) {
			badWork.Nonce = strconv.FormatUint(n, 10)
			break
		}
	}
	wantCode := func(got, want diag.Code, what string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: got %q, want %s", what, got, want)
		}
	}
	wantCode(call(t, srv, "POST", "/volunteer/v1/join", "", badWork, nil), diag.VolunteerBadProof, "bad proof of work")
	forged := good
	forged.Sig = bob.solve(c).Sig
	wantCode(call(t, srv, "POST", "/volunteer/v1/join", "", forged, nil), diag.VolunteerBadProof, "join signed by another key")
	stolen := bob.solve(c) // alice's challenge, bob's key
	wantCode(call(t, srv, "POST", "/volunteer/v1/join", "", stolen, nil), diag.VolunteerBadChallenge, "challenge of another key")
	var sess Session
	wantCode(call(t, srv, "POST", "/volunteer/v1/join", "", good, &sess), "", "good join")
	if sess.Peer != receipt.VolunteerPeer(alice.key) || sess.Token == "" {
		t.Fatalf("session: %+v", sess)
	}
	wantCode(call(t, srv, "POST", "/volunteer/v1/join", "", good, nil), diag.VolunteerBadChallenge, "replayed challenge")

	// Work: no token, a forged one, a shard not leased.
	wantCode(call(t, srv, "POST", "/volunteer/v1/lease", "", LeaseRequest{Max: 1}, nil), diag.VolunteerNoSession, "no token")
	wantCode(call(t, srv, "POST", "/volunteer/v1/lease", sess.Token[:len(sess.Token)-4]+"AAAA", LeaseRequest{Max: 1}, nil), diag.VolunteerNoSession, "forged token")
	// A job that reads (public) input tables is submitted first: the tab
	// neither sees it on the page nor is leased its shards.
	tables := content.Hash([]byte("tables"))
	be.m.Apply(coordinator.SubmitJob{Job: tables, Name: "tables", Bundle: content.Hash([]byte("bt")), Submitter: "alice", Policy: coordinator.Policy{Replicas: 2},
		Inputs: []trust.Item{{Name: "points", Class: trust.Public}}, Shards: []coordinator.ShardPlan{{Index: 0, ID: content.Hash([]byte("t0")), Price: 1, PriceBasis: "flat"}},
		Now: time.Now().UnixMilli()})
	job := content.Hash([]byte("job"))
	be.m.Apply(coordinator.SubmitJob{Job: job, Name: "mc", Bundle: content.Hash([]byte("b")), Submitter: "alice", Policy: coordinator.Policy{Replicas: 2},
		Shards: []coordinator.ShardPlan{{Index: 0, ID: content.Hash([]byte("s0")), Price: 1, PriceBasis: "flat"}, {Index: 1, ID: content.Hash([]byte("s1")), Price: 1, PriceBasis: "flat"}},
		Now:    time.Now().UnixMilli()})
	result := []byte("result bytes")
	sign := func(shard int) string {
		st := coordinator.StatementOf(job, shard, content.Hash(result), coordinator.Policy{Replicas: 2}, sess.Peer)
		sig, _ := alice.priv.Sign(nil, st.Bytes(), &ed25519.Options{Context: receipt.PurposeResult})
		return base64.StdEncoding.EncodeToString(sig)
	}
	rr := ResultRequest{Job: job, Shard: 1, Result: base64.StdEncoding.EncodeToString(result), Sig: sign(1)}
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, rr, nil), diag.PoolNoLease, "result for a shard not leased")
	var lr LeaseResponse
	wantCode(call(t, srv, "POST", "/volunteer/v1/lease", sess.Token, LeaseRequest{Max: 1}, &lr), "", "lease")
	if len(lr.Grants) != 1 || lr.Grants[0].Job != job || lr.Grants[0].Shard != 0 || lr.Grants[0].Tier != receipt.TierReplayable {
		t.Fatalf("grants: %+v (want shard 0 of the job without inputs)", lr)
	}
	var p Project
	wantCode(call(t, srv, "GET", "/volunteer/v1/project", "", nil, &p), "", "project")
	if len(p.Jobs) != 1 || p.Jobs[0].ID != job || p.MaxLeases != 1 {
		t.Fatalf("the page lists %+v (max leases %d), want only the job without inputs and the cap 1", p.Jobs, p.MaxLeases)
	}
	// MaxLeases 1: holding shard 0, the tab gets no second shard (SC7510).
	wantCode(call(t, srv, "POST", "/volunteer/v1/lease", sess.Token, LeaseRequest{Max: 1}, nil), diag.VolunteerLeaseCap, "lease past the cap")
	rr.Shard = 1
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, rr, nil), diag.PoolNoLease, "result for another shard than the one leased")
	rr.Shard, rr.Sig = 0, sign(1) // signed for another shard
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, rr, nil), diag.VerifyBadSignature, "badly signed result")
	rr.Sig = sign(0)
	var rep coordinator.ReportResponse
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, rr, &rep), "", "good result")
	if rep.Peer != sess.Peer || rep.Result != content.Hash(result) {
		t.Fatalf("report: %+v", rep)
	}

	// A result stored with the data plane comes as its ref: only one of
	// the two forms, and only a ref whose blob is here.
	wantCode(call(t, srv, "POST", "/volunteer/v1/lease", sess.Token, LeaseRequest{Max: 1}, &lr), "", "lease")
	if len(lr.Grants) != 1 || lr.Grants[0].Shard != 1 {
		t.Fatalf("grants: %+v", lr)
	}
	byRef := ResultRequest{Job: job, Shard: 1, ResultRef: content.Hash(result), Result: rr.Result, Sig: sign(1)}
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, byRef, nil), diag.VolunteerBadRequest, "both result and result_ref")
	byRef.Result = ""
	byRef.ResultRef = content.Hash([]byte("never stored"))
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, byRef, nil), diag.BlobMissing, "result_ref of a blob not stored")
	be.PutBlob(context.Background(), result) // as the tab's putBlob does
	byRef.ResultRef = content.Hash(result)
	wantCode(call(t, srv, "POST", "/volunteer/v1/results", sess.Token, byRef, &rep), "", "result by ref")
	if rep.Peer != sess.Peer || rep.Result != content.Hash(result) || rep.Shard != 1 {
		t.Fatalf("report by ref: %+v", rep)
	}

	// A flood from one address: the burst (6) is spent by now.
	var code diag.Code
	for range 10 {
		if code = call(t, srv, "POST", "/volunteer/v1/challenge", "", ChallengeRequest{Key: bob.key}, nil); code != "" {
			break
		}
	}
	wantCode(code, diag.VolunteerRateLimited, "flood of challenges")

	// A consortium pool takes no volunteers.
	_, csrv := rig(t, trust.Consortium, Options{})
	wantCode(call(t, csrv, "POST", "/volunteer/v1/challenge", "", ChallengeRequest{Key: alice.key}, nil), diag.VolunteerClosed, "consortium pool")
}

// Every volunteer route is documented in docs/api.md.
func TestRoutesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Routes {
		method, path, _ := strings.Cut(r, " ")
		if !strings.Contains(string(doc), "`"+method+" "+path+"`") {
			t.Errorf("docs/api.md does not list %s", r)
		}
	}
}

// Prefix masks IPv4 to the /24 and IPv6 to the /56 replicas are kept
// apart by; a mapped IPv4 address is IPv4.
func TestPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"198.51.100.7":          "198.51.100.0/24",
		"::ffff:198.51.100.7":   "198.51.100.0/24",
		"2001:db8:1:2ff:1::9":   "2001:db8:1:200::/56",
		"2001:db8:1:2ee:ffff::": "2001:db8:1:200::/56",
		"not-an-ip":             "not-an-ip",
	} {
		if got := Prefix(in, ReplicaPrefixV4, ReplicaPrefixV6); got != want {
			t.Errorf("Prefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// One IPv6 host owns its whole /64 (and a site its /48): before, each
// fresh address passed the per-address limit, and a thousand of them used
// up the global budget and locked every honest volunteer out. Now the
// /64 gets the per-client burst, the /48 ten times that, and a volunteer
// elsewhere still joins.
func TestLimiterKeysIPv6ByPrefix(t *testing.T) {
	l := newLimiter(6, 4, 600)
	now := time.Unix(1000, 0)
	passed := 0
	for i := range 1000 {
		if l.allow(fmt.Sprintf("2001:db8:1:2::%x", i+1), now) == "" {
			passed++
		}
	}
	if passed != 4 {
		t.Errorf("1000 addresses of one /64 passed %d times, want the burst of 4", passed)
	}
	passed = 0
	for i := range 1000 {
		if l.allow(fmt.Sprintf("2001:db8:1:%x::1", i+3), now) == "" {
			passed++
		}
	}
	if passed != 36 { // the /48's 40, less the /64's 4
		t.Errorf("1000 /64s of one /48 passed %d times, want 36", passed)
	}
	for _, ip := range []string{"2001:db8:ffff::1", "198.51.100.9"} {
		if why := l.allow(ip, now); why != "" {
			t.Errorf("an honest volunteer at %s was refused: %s", ip, why)
		}
	}
}

// A client that keeps asking stays limited however many new addresses
// flood the table: the least recently used entries go, never the whole
// table (before, past 100,000 addresses everyone's limits were reset).
func TestLimiterNeverResetsEveryone(t *testing.T) {
	l := newLimiter(6, 4, 1<<30) // no global limit: only the client's own shows
	now := time.Unix(1000, 0)
	const x = "203.0.113.5"
	for range 4 {
		l.allow(x, now)
	}
	for i := range 3 * maxLimiterKeys / 2 {
		l.allow(fmt.Sprintf("%d.%d.%d.1", 1+i>>16, (i>>8)&255, i&255), now)
		if i%1000 == 0 {
			if why := l.allow(x, now); why == "" {
				t.Fatalf("after %d other addresses, the exhausted client was let in again", i+1)
			}
		}
	}
	if n := l.clients.order.Len(); n > maxLimiterKeys || len(l.clients.byKey) != n {
		t.Errorf("the client table holds %d entries (%d keys), bound %d", n, len(l.clients.byKey), maxLimiterKeys)
	}
}
