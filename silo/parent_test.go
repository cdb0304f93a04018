package silo_test

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"log"
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
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/silo"
)

// parentJobs is the parent's replica as its API reads it: the real
// api.Server answers GET /v1/jobs/{id} from it (nothing else is called).
type parentJobs struct {
	api.Reader
	jobs map[content.Ref]coordinator.JobStatus
}

func (p parentJobs) Job(id content.Ref) (coordinator.JobStatus, error) {
	if js, ok := p.jobs[id]; ok {
		return js, nil
	}
	return coordinator.JobStatus{}, diag.New(diag.PoolUnknownJob, string(id), "no such job")
}

// A silo led by a child cluster (parent_federation set) checks a
// hierarchical round with the parent before anything keyed to its Params
// leaves: roundWorld's host stands for child-a, which serves its silos a
// copy of the parent's round bundle whose sub-cohort Params carry the
// child's own X25519 key instead of the parent's (the attack: the child
// would open the sealed unmasking shares and learn its sub-cohort's sum).
// The parent's aggregator — the real API server over mutual TLS pinned to
// the parent's federation, which lists the silos under child-a — names
// the genuine bundle for its job. The silo declines with SC7611 (saying
// which bundles differ) and sends nothing to the round's host, charges
// nothing and counts no round; a sub-job naming a parent job the parent
// does not have, or a parent bundle that puts the silo in another
// child's sub-cohort, is declined the same way; with the parent down,
// SC7612. A parent federation listing the silo under another key is
// refused (SC7610).
// The honest path (bundle equal to the parent's, the round completes) is
// TestTreeFederatedRun's, with the real binaries.
func TestSiloChecksRoundWithParent(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)

	// The parent: one aggregator serving the real API; child-a; the four
	// silos under child-a.
	pid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	cid, _ := identity.Generate()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var pf strings.Builder
	fmt.Fprintf(&pf, "federation: parent\nregime: consortium\nmembers:\n  - {name: p-1, role: aggregator, public_key: %s, address: %q}\n  - {name: child-a, role: cluster, public_key: %s}\n", pid.Public(), ln.Addr().String(), cid.Public())
	for _, n := range siloNames {
		fmt.Fprintf(&pf, "  - {name: %s, role: silo, public_key: %s, cluster: child-a}\n", n, w.ids[n].Public())
	}
	pfile := filepath.Join(w.dir, "parent-federation.yaml")
	if err := os.WriteFile(pfile, []byte(pf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	pfed, err := identity.LoadFederation(pfile)
	if err != nil {
		t.Fatal(err)
	}
	reader := parentJobs{jobs: map[content.Ref]coordinator.JobStatus{}}
	srvCfg, err := identity.ServerTLSConfig(pid, pfed)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: (&api.Server{Fed: pfed, Read: reader}).Handler(), ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(tls.NewListener(ln, srvCfg))
	}()
	stopParent := func() { srv.Close(); <-served }
	defer stopParent()

	const name = "hospital-a"
	cfg := w.siloConfig(name, nil)
	cfg.ParentFederation = pfile
	var mu sync.Mutex
	var logged strings.Builder
	logText := func() string { mu.Lock(); defer mu.Unlock(); return logged.String() }
	a, err := silo.Open(cfg, w.ids[name], w.fed, silo.Options{Logf: func(f string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&logged, f+"\n", args...)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.RoundTimeout = time.Minute
	w.mu.Lock()
	w.silos[name] = a
	w.mu.Unlock()
	if a.Parent == nil || a.Parent.Cluster != "child-a" {
		t.Fatalf("the silo's parent: %+v, want child-a of %s", a.Parent, pfile)
	}

	// Round 0 as the parent plans it: one sub-cohort, child-a's, whose
	// Params name the parent's fresh key.
	cat, _ := catalog.Builtin()
	spec := &fl.RunSpec{Name: "parent-check", Strategy: "fedavg", Params: map[string]any{"lr": 0.1, "epochs": int64(1)},
		Model: fl.ModelSpec{Kind: "logistic", Inputs: 3}, Dataset: "patients", Rounds: 1, MinCohort: 3,
		DP: true, Clip: 1, Sigma: 1.5, SecureAgg: true, Seed: 7, Standardize: fl.StandardizeLocal}
	run := mustResolve(t, w, cat, spec)
	global, err := fl.Init(context.Background(), script.Env{Catalog: cat}, run.st, 3)
	if err != nil {
		t.Fatal(err)
	}
	_, b := w.startRound(run.run, run.canon, run.st, global, 0, siloNames)
	bundle := func(key *ecdh.PrivateKey, cluster string) content.Ref {
		h := b
		sub := b.SecAgg
		sub.Round, sub.Parent = "sub-"+b.SecAgg.Round, key.PublicKey().Bytes()
		h.SubCohorts = []fl.SubCohort{{Cluster: cluster, SecAgg: sub}}
		raw, err := content.Encode(&h)
		if err != nil {
			t.Fatal(err)
		}
		return w.put(raw)
	}
	parentKey, _ := ecdh.X25519().GenerateKey(rand.Reader)
	childKey, _ := ecdh.X25519().GenerateKey(rand.Reader)
	genuine, forged := bundle(parentKey, "child-a"), bundle(childKey, "child-a")
	parentJob := content.Hash([]byte("parent round job"))
	pj := coordinator.JobStatus{ID: parentJob, Bundle: genuine, Run: run.run, Round: 0, State: coordinator.JobRunning}
	for i, n := range siloNames {
		pj.Shards = append(pj.Shards, coordinator.ShardStatus{Index: i, Peer: n, Via: "child-a", State: coordinator.StateLeased})
	}
	reader.jobs[parentJob] = pj

	// The child's sub-job, as its lease describes it to the silo.
	take := func(bundle, job content.Ref) silo.Contribution {
		t.Helper()
		st := coordinator.JobStatus{ID: content.Hash([]byte("sub-job " + string(bundle) + string(job))), Bundle: bundle, Run: run.run, Round: 0, State: coordinator.JobRunning,
			Delegated: &coordinator.Delegation{Delegate: "child-a", Job: job, Shards: []int{0, 1, 2, 3}, Lease: "l"}}
		a.HandleRound(context.Background(), coordinator.LeaseGrant{Job: st.ID, Shard: 0, Expiry: time.Now().Add(time.Hour).UnixMilli()}, st)
		return w.contribution(name).Record
	}
	declined := func(what string, rec silo.Contribution, code diag.Code) {
		t.Helper()
		if rec.Status != silo.Declined || len(rec.Refusals) != 1 || rec.Refusals[0].Code != code || rec.LedgerEntry != "" {
			t.Fatalf("%s: %+v, want a decline with %s and no charge", what, rec, code)
		}
	}

	// The attack: the child's copy carries its own key.
	declined("a bundle with the child's key", take(forged, parentJob), diag.SiloParentMismatch)
	if l := logText(); !strings.Contains(l, fmt.Sprintf("child cluster child-a served round bundle %s", forged.Short())) || !strings.Contains(l, "has bundle "+genuine.Short()) {
		t.Fatalf("the silo's log does not say which bundles differ:\n%s", l)
	}
	// A sub-job naming a job the parent does not have.
	declined("an unknown parent job", take(genuine, content.Hash([]byte("no such job"))), diag.SiloParentMismatch)

	// A parent job whose bundle puts the silo in another child's
	// sub-cohort: not the Params its child may give it.
	elsewhere := content.Hash([]byte("parent round job, child-b"))
	pjb := pj
	pjb.ID, pjb.Bundle = elsewhere, bundle(parentKey, "child-b")
	reader.jobs[elsewhere] = pjb
	declined("a sub-cohort of another child", take(pjb.Bundle, elsewhere), diag.SiloParentMismatch)
	// A parent that lists the silo under another key refuses the config.
	if _, err := silo.OpenParent(cfg, w.ids["hospital-b"]); !isDiag(err, diag.SiloParentConfig) {
		t.Fatalf("a parent federation listing %s with another key: %v, want SC7610", name, err)
	}

	// The parent out of reach.
	stopParent()
	a.Parent.Timeout = time.Second
	declined("the parent down", take(genuine, parentJob), diag.SiloParentUnreachable)

	w.mu.Lock()
	sent := w.sent[name]
	w.mu.Unlock()
	if sent != 0 {
		t.Fatalf("the silo sent %d requests to the round's host after failing its check with the parent", sent)
	}
	snap, err := a.Ledger.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range snap.Entries() {
		if e.Kind == dp.KindCharge {
			t.Fatalf("the ledger holds a charge (%s) for a round the silo declined", e.Charge.Consumer)
		}
	}
	if recs, err := a.Rounds.AcceptedSince(time.Now().Add(-time.Hour)); err != nil || len(recs) != 0 {
		t.Fatalf("rounds declined by the parent check count against the daily limit: %+v (%v)", recs, err)
	}
}

func isDiag(err error, code diag.Code) bool {
	ds, ok := diag.As(err)
	return ok && len(ds) > 0 && ds[0].Code == code
}
