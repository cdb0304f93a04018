package silo_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/silo"
	"github.com/scellis/scellis/trust"
)

// roundWorld is one aggregator endpoint in this process — a real
// secure-aggregation host (secagg/wire) and the blob, renew, release and
// report routes of the control plane, served over mutual TLS as agg-1 —
// and four silos. It stands in for the aggregator's run driver, which
// submits round jobs the same way (a round bundle blob per round job).
type roundWorld struct {
	t     *testing.T
	dir   string
	fed   *identity.Federation
	ids   map[string]*identity.Identity
	host  *wire.Host
	url   string
	silos map[string]*silo.Appliance

	mu       sync.Mutex
	blobs    map[content.Ref][]byte
	reports  map[string]content.Ref // silo → reported contribution blob
	badOrder []string               // masked inputs that arrived before their charge
	masked   map[string]bool
	sent     map[string]int // requests each silo made to the secure-aggregation host
}

var siloNames = []string{"hospital-a", "hospital-b", "hospital-c", "hospital-d"}

func newRoundWorld(t *testing.T) *roundWorld {
	w := &roundWorld{t: t, dir: t.TempDir(), ids: map[string]*identity.Identity{}, silos: map[string]*silo.Appliance{},
		blobs: map[content.Ref][]byte{}, reports: map[string]content.Ref{}, masked: map[string]bool{}, sent: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var fed strings.Builder
	fmt.Fprintf(&fed, "federation: test\nregime: consortium\nmembers:\n")
	for _, name := range append([]string{"agg-1"}, siloNames...) {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		w.ids[name] = id
		if name == "agg-1" {
			fmt.Fprintf(&fed, "  - {name: agg-1, role: aggregator, public_key: %s, address: %q}\n", id.Public(), ln.Addr().String())
		} else {
			fmt.Fprintf(&fed, "  - {name: %s, role: silo, public_key: %s}\n", name, id.Public())
		}
	}
	if w.fed, err = identity.ParseFederation(filepath.Join(w.dir, "federation.yaml"), []byte(fed.String())); err != nil {
		t.Fatal(err)
	}
	cfg, err := identity.ServerTLSConfig(w.ids["agg-1"], w.fed)
	if err != nil {
		t.Fatal(err)
	}
	w.host = wire.NewHost(w.fed, wire.HostOptions{LongPoll: time.Second})
	mux := http.NewServeMux()
	mux.Handle(wire.Prefix, w.checkCharged(w.host))
	mux.HandleFunc("GET /blobs/{ref}", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		b, ok := w.blobs[content.Ref(r.PathValue("ref"))]
		w.mu.Unlock()
		if !ok {
			http.NotFound(rw, r)
			return
		}
		rw.Write(b)
	})
	mux.HandleFunc("PUT /blobs/{ref}", func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.put(b)
		rw.WriteHeader(http.StatusCreated)
	})
	// Commit–reveal as the coordinator checks it: a report must open the
	// silo's earlier commitment.
	commits := map[string]content.Ref{}
	mux.HandleFunc("POST /v1/commits", func(rw http.ResponseWriter, r *http.Request) {
		var c api.CommitRequest
		json.NewDecoder(r.Body).Decode(&c)
		m, _ := w.fed.PeerFromRequest(r)
		w.mu.Lock()
		commits[m.Name] = c.Commitment
		w.mu.Unlock()
		json.NewEncoder(rw).Encode(coordinator.CommitResponse{Job: c.Job, Shard: c.Shard, Commits: 1, Reveal: true})
	})
	mux.HandleFunc("POST /v1/results", func(rw http.ResponseWriter, r *http.Request) {
		var rep api.ResultReport
		json.NewDecoder(r.Body).Decode(&rep)
		m, _ := w.fed.PeerFromRequest(r)
		nonce, err := coordinator.ParseNonce(rep.Nonce)
		w.mu.Lock()
		opens := err == nil && coordinator.Commitment(rep.Result, m.Name, rep.Job, rep.Shard, nonce) == commits[m.Name]
		w.mu.Unlock()
		if !opens {
			http.Error(rw, "the report does not open the commitment", http.StatusBadRequest)
			return
		}
		w.mu.Lock()
		w.reports[m.Name] = rep.Result
		w.mu.Unlock()
		json.NewEncoder(rw).Encode(coordinator.ReportResponse{Job: rep.Job, Shard: rep.Shard, Peer: m.Name, Result: rep.Result})
	})
	mux.HandleFunc("POST /v1/renew", func(rw http.ResponseWriter, r *http.Request) { rw.Write([]byte("{}")) })
	mux.HandleFunc("POST /v1/release", func(rw http.ResponseWriter, r *http.Request) { rw.Write([]byte("{}")) })
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(tls.NewListener(ln, cfg))
	}()
	t.Cleanup(func() {
		w.host.Close()
		srv.Close()
		<-served
	})
	w.url = "https://" + ln.Addr().String()
	return w
}

func (w *roundWorld) put(b []byte) content.Ref {
	ref := content.Hash(b)
	w.mu.Lock()
	w.blobs[ref] = append([]byte(nil), b...)
	w.mu.Unlock()
	return ref
}

// checkCharged counts every request a silo makes to the host and records,
// when a silo's masked input arrives, whether its ledger already holds a
// charge for the round (law 6: charge before release).
func (w *roundWorld) checkCharged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if m, ok := w.fed.PeerFromRequest(r); ok {
			w.mu.Lock()
			w.sent[m.Name]++
			w.mu.Unlock()
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/masked") {
			m, _ := w.fed.PeerFromRequest(r)
			w.mu.Lock()
			a := w.silos[m.Name]
			w.mu.Unlock()
			snap, err := dp.Verify(a.Config.Ledger, m.PublicKey.Ed25519())
			charged := false
			if err == nil {
				for _, e := range snap.Entries() {
					charged = charged || e.Kind == dp.KindCharge
				}
			}
			w.mu.Lock()
			w.masked[m.Name] = true
			if !charged {
				w.badOrder = append(w.badOrder, m.Name)
			}
			w.mu.Unlock()
		}
		h.ServeHTTP(rw, r)
	})
}

// openSilo opens (or reopens) a silo appliance with a dataset of 3
// features; policy lists the strategies it accepts (nil: the default).
func (w *roundWorld) openSilo(name string, strategies []string) *silo.Appliance {
	w.t.Helper()
	c := w.siloConfig(name, strategies)
	a, err := silo.Open(c, w.ids[name], w.fed, silo.Options{Logf: func(f string, args ...any) { w.t.Logf(name+": "+f, args...) }})
	if err != nil {
		w.t.Fatalf("opening silo %s: %v", name, err)
	}
	w.t.Cleanup(func() { a.Close() })
	a.RoundTimeout = time.Minute
	w.mu.Lock()
	w.silos[name] = a
	w.mu.Unlock()
	return a
}

// siloConfig writes the silo's dataset (once) and returns its config.
func (w *roundWorld) siloConfig(name string, strategies []string) *config.Silo {
	w.t.Helper()
	dir := filepath.Join(w.dir, name)
	csv := filepath.Join(dir, "patients.csv")
	if _, err := os.Stat(csv); err != nil {
		os.MkdirAll(dir, 0o700)
		var b bytes.Buffer
		b.WriteString("x1,x2,x3,y\n")
		for i := range 60 {
			x := float64(i%7)/7 - 0.5
			fmt.Fprintf(&b, "%g,%g,%g,%d\n", x, math.Sin(float64(i)), float64(len(name)%3)/3, (i+len(name))%2)
		}
		if err := os.WriteFile(csv, b.Bytes(), 0o600); err != nil {
			w.t.Fatal(err)
		}
	}
	if strategies == nil {
		strategies = config.DefaultStrategies()
	}
	c := &config.Silo{
		File: filepath.Join(dir, "silo.yaml"), Name: name, DataDir: filepath.Join(dir, "state"),
		Ledger: filepath.Join(dir, "state", "privacy.ledger"), LogLevel: "warn",
		Datasets: []config.Dataset{{Name: "patients", Path: csv, Label: "y", Class: trust.Confidential,
			Budget: config.Budget{Epsilon: 50, Delta: 1e-5}, Unit: fl.UnitSilo}},
		Policy: config.SiloPolicy{Strategies: strategies, MinCohort: 3},
	}
	return c
}

// startRound builds round r of the run the way the run driver does: the
// global blob, the round bundle blob, the secure-aggregation round opened
// on the host; it returns the job status silos see for their shard.
func (w *roundWorld) startRound(runRef content.Ref, canon *fl.Canonical, st *fl.Strategy, global fl.Global, r int, members []string) (coordinator.JobStatus, fl.RoundBundle) {
	w.t.Helper()
	cat, _ := catalog.Builtin()
	env := script.Env{Catalog: cat}
	dims, err := fl.UpdateDims(context.Background(), env, st, global)
	if err != nil {
		w.t.Fatal(err)
	}
	gb, err := global.Encode()
	if err != nil {
		w.t.Fatal(err)
	}
	summed, grid := canon.Spec.Summed(dims)
	b := fl.RoundBundle{
		Format: fl.RoundFormat, Run: runRef, Round: r, Strategy: canon.Strategy, Global: w.put(gb),
		UpdateDim: dims, Metrics: summed, Seed: 7,
		SecAgg: secagg.Params{Round: fmt.Sprintf("%s/%d", runRef, r), Dim: dims + len(summed),
			Clip: 1e6, Weighted: true, MaxWeight: 1e9, GridBits: grid},
	}
	for _, m := range members {
		b.SecAgg.Members = append(b.SecAgg.Members, secagg.Member{ID: m, Key: w.ids[m].Public().Ed25519()})
	}
	bb, err := content.Encode(&b)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.host.Open(b.SecAgg, wire.Deadlines{Advertise: 6 * time.Second, Share: 10 * time.Second, Mask: 10 * time.Second, Unmask: 10 * time.Second}); err != nil {
		w.t.Fatal(err)
	}
	bref := w.put(bb)
	return coordinator.JobStatus{ID: content.Hash(append([]byte("job"), bb...)), Bundle: bref, Run: runRef, Round: r, State: coordinator.JobRunning}, b
}

func (w *roundWorld) contribution(name string) *silo.SignedContribution {
	w.t.Helper()
	w.mu.Lock()
	ref, ok := w.reports[name]
	b := w.blobs[ref]
	w.mu.Unlock()
	if !ok {
		w.t.Fatalf("%s reported nothing", name)
	}
	c, err := silo.DecodeContribution(b)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := c.Verify(w.fed); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// TestRoundAgainstSecAggHost runs two SCAFFOLD rounds with four silos
// in-process against a real secure-aggregation host: three take part
// (ledger charged exactly the accountant's ε, before the masked input
// arrives), one whose policy accepts only fedavg declines; the client
// state survives reopening a silo.
func TestRoundAgainstSecAggHost(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	for _, n := range siloNames[:3] {
		w.openSilo(n, nil)
	}
	w.openSilo("hospital-d", []string{"fedavg"})

	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	spec := &fl.RunSpec{Name: "scaffold-test", Strategy: "scaffold", Params: map[string]any{"lr": 0.1, "epochs": int64(1)},
		Model: fl.ModelSpec{Kind: "logistic", Inputs: 3}, Dataset: "patients", Rounds: 2, MinCohort: 3,
		DP: true, Clip: 1, Sigma: 1.5, SecureAgg: true, Seed: 7, Standardize: fl.StandardizeLocal}
	canon, runRef, st, err := spec.Resolve(cat, "")
	if err != nil {
		t.Fatal(err)
	}
	cb, err := content.Encode(canon)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.put(cb); got != runRef {
		t.Fatalf("run ref %s, blob %s", runRef, got)
	}
	global, err := fl.Init(context.Background(), script.Env{Catalog: cat}, st, 3)
	if err != nil {
		t.Fatal(err)
	}

	// The accountant's ε of one update-level round at the dataset's δ.
	want, _, err := dp.Epsilon(dp.DefaultOrders(), mustRDP(t, dp.SubsampledGaussian(1.5, 1, 1)), 1e-5, dp.Improved)
	if err != nil {
		t.Fatal(err)
	}

	runRound := func(r int) fl.RoundBundle {
		js, b := w.startRound(runRef, canon, st, global, r, siloNames)
		var wg sync.WaitGroup
		for i, n := range siloNames {
			a := w.silos[n]
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.HandleRound(context.Background(), coordinator.LeaseGrant{Job: js.ID, Shard: i, Expiry: time.Now().Add(time.Hour).UnixMilli()}, js)
			}()
		}
		res, err := w.host.Wait(context.Background(), b.SecAgg.Round)
		if err != nil {
			t.Fatalf("round %d: secure aggregation: %v", r, err)
		}
		wg.Wait()
		if len(res.Sum) != b.UpdateDim+len(b.Metrics) {
			t.Fatalf("round %d: sum of %d values", r, len(res.Sum))
		}
		// Differencing: under DP the sum holds the update alone and every
		// site's weight is 1, so what a round with one more or one fewer
		// site reveals beyond the noised update is the public participant
		// count — nothing about a site's rows, loss or correct answers.
		if len(b.Metrics) != 0 || len(res.Sum) != b.UpdateDim || res.Weight != float64(len(res.Contributors)) {
			t.Fatalf("round %d: metrics %v summed, weight %v for %d contributors", r, b.Metrics, res.Weight, len(res.Contributors))
		}
		return b
	}

	runRound(0)
	for _, n := range siloNames[:3] {
		c := w.contribution(n)
		if c.Record.Status != silo.Contributed || c.Record.LedgerEntry == "" {
			t.Fatalf("%s: contribution %+v", n, c.Record)
		}
		if math.Abs(c.Record.Epsilon-want) > 1e-9 {
			t.Errorf("%s charged ε = %v, the accountant says %v", n, c.Record.Epsilon, want)
		}
		stt, err := w.silos[n].Ledger.Status("patients")
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(stt.Spent-want) > 1e-9 {
			t.Errorf("%s ledger spent ε = %v, want %v", n, stt.Spent, want)
		}
		// The charge's outbox entry is gone once its record was delivered.
		if left, err := os.ReadDir(filepath.Join(w.silos[n].Config.DataDir, "outbox")); err != nil || len(left) != 0 {
			t.Errorf("%s's outbox after the round: %d entries (%v)", n, len(left), err)
		}
	}
	d := w.contribution("hospital-d")
	if d.Record.Status != silo.Declined || len(d.Record.Refusals) == 0 || d.Record.Refusals[0].Code != "SC9201" || d.Record.LedgerEntry != "" {
		t.Fatalf("hospital-d: %+v", d.Record)
	}
	if stt, _ := w.silos["hospital-d"].Ledger.Status("patients"); stt.Spent != 0 {
		t.Errorf("hospital-d spent ε = %v for a round it declined", stt.Spent)
	}
	w.mu.Lock()
	if len(w.badOrder) > 0 {
		t.Errorf("masked inputs arrived before their ledger charge: %v", w.badOrder)
	}
	if w.masked["hospital-d"] {
		t.Errorf("hospital-d sent a masked input for a round it declined")
	}
	w.mu.Unlock()

	// SCAFFOLD's client state is on disk; reopening the silo keeps it.
	statePath := filepath.Join(w.silos["hospital-a"].Config.DataDir, strings.TrimPrefix(string(runRef), "sha256:"), "state")
	before, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatalf("no client state after round 0: %v", err)
	}
	state, err := fl.DecodeState(before)
	if err != nil || state == nil {
		t.Fatalf("client state %v, %v", state, err)
	}
	w.silos["hospital-a"].Close()
	a2 := w.openSilo("hospital-a", nil)
	runRound(1)
	after, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(before, after) {
		t.Errorf("the client state did not advance in round 1")
	}
	if c := w.contribution("hospital-a"); c.Record.Status != silo.Contributed || c.Record.Round != 1 {
		t.Fatalf("hospital-a round 1: %+v", c.Record)
	}
	if stt, _ := a2.Ledger.Status("patients"); stt.Spent <= want {
		t.Errorf("hospital-a spent ε = %v after two rounds", stt.Spent)
	}
}

func mustRDP(t *testing.T, m dp.Mechanism) []float64 {
	r, err := m.RDP(dp.DefaultOrders())
	if err != nil {
		t.Fatal(err)
	}
	return r
}
