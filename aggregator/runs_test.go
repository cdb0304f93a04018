package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/testharness"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/pool"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg/transport"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/trust"
)

// runPool is a one-node aggregator with silos s1…sN and a launcher
// (alice), in this process: real Raft, real mutual TLS, the real secure
// aggregation host. No silo process exists yet, so the silos are driven
// here as a silo would: lease the round shard, fetch the bundle and the
// global model by hash from the blob endpoint, run the client step, take
// part in secure aggregation, upload a contribution record and report its
// hash.
type runPool struct {
	*testPool
	silos []string
	data  map[string]*model.Dataset

	mu      sync.Mutex
	updates [][]float64 // every silo's unmasked input, for the law-3 check
	// p2pSilo, when set before startSilos, takes part in secure
	// aggregation over a data channel to the host (the node needs
	// Options.P2PLoopback).
	p2pSilo string
}

func newRunPool(tb testing.TB, silos int, opt Options) *runPool {
	tb.Helper()
	p := &runPool{data: map[string]*model.Dataset{}}
	members := []testMember{{"alice", identity.Researcher}}
	for i := 1; i <= silos; i++ {
		p.silos = append(p.silos, fmt.Sprintf("s%d", i))
		members = append(members, testMember{p.silos[i-1], identity.Silo})
	}
	sites, err := datagen.Hospitals(silos, 120, 11)
	if err != nil {
		tb.Fatal(err)
	}
	for i, s := range sites {
		p.data[p.silos[i]] = model.FitStandardizer(s.Data).Apply(s.Data)
	}
	// The rounds' deadlines and the silos' lease are scaled for a busy
	// machine (testharness.Slack): under -race at a load of 30 on two
	// cores, silos missed 3 s to advertise and a resumed run paused again.
	// The lease scales with them: these silos do not poll while in a
	// round, so a round longer than the lease would excuse them all.
	opt.SecAgg = wire.Deadlines{Advertise: slack(3 * time.Second), Share: slack(2 * time.Second), Mask: slack(2 * time.Second), Unmask: slack(2 * time.Second)}
	if opt.SiloLease == 0 {
		opt.SiloLease = 6 * time.Second // the node's default (siloLease)
	}
	opt.SiloLease = slack(opt.SiloLease)
	opt.SecAggLongPoll = time.Second
	opt.ReportGrace = 5 * time.Second
	p.testPool = startTestNode(tb, trust.Own, members, opt)
	return p
}

// slack scales a test's deadline for a busy machine (testharness.Slack).
func slack(d time.Duration) time.Duration {
	return time.Duration(float64(d) * testharness.Slack())
}

func (p *runPool) client(name string) *api.Client {
	c, err := api.NewClient(p.ids[name], p.fed)
	if err != nil {
		p.tb.Fatal(err)
	}
	return c
}

// launch resolves a run spec, uploads its canonical form and starts it
// through the API, as `scellis fl launch` will.
func (p *runPool) launch(ctx context.Context, spec fl.RunSpec) (content.Ref, error) {
	canon, id, _, err := spec.Resolve(p.cat, "")
	if err != nil {
		return "", err
	}
	b, err := content.Encode(canon)
	if err != nil {
		return "", err
	}
	c := p.client("alice")
	ref, err := c.PutBlob(ctx, b)
	if err != nil {
		return "", err
	}
	if ref != id {
		return "", fmt.Errorf("uploaded spec %s, run ID %s", ref, id)
	}
	resp, err := c.StartRun(ctx, api.RunRequest{Spec: ref})
	if err != nil {
		return "", err
	}
	return resp.Run, nil
}

// contribution is the record a silo signs and reports (here unsigned: the
// silo's own format is the silo's business).
type contribution struct {
	Run   content.Ref `cbor:"run"`
	Round int         `cbor:"round"`
	Silo  string      `cbor:"silo"`
}

// runSilo plays silo name until ctx ends; drop(round) makes it lease the
// round's shard and then never take part.
func (p *runPool) runSilo(ctx context.Context, name string, drop func(round int) bool) {
	c := p.client(name)
	id := p.ids[name]
	tlsCfg, err := identity.ClientTLSConfig(id, p.fed, "agg-1", identity.Aggregator)
	if err != nil {
		p.tb.Error(err)
		return
	}
	hc := &http.Client{Transport: api.Transport(tlsCfg)}
	// overDC, when set, carries the silo's secure aggregation over a data
	// channel to the host (p2pSilo).
	var overDC *dataplane.Peer
	if name == p.p2pSilo {
		b, err := dataplane.StartMember(ctx, dataplane.MemberConfig{Identity: id, Fed: p.fed, Name: name, Loopback: true, HTTPS: c})
		if err != nil {
			p.tb.Error(err)
			return
		}
		overDC = b.Peer
	}
	for ctx.Err() == nil {
		lr, err := c.Lease(ctx, api.LeaseRequest{Max: 1})
		if err != nil || len(lr.Grants) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		g := lr.Grants[0]
		if err := p.round(ctx, c, hc, overDC, name, id, g, drop); err != nil && ctx.Err() == nil {
			p.tb.Logf("silo %s: %v", name, err)
		}
	}
}

func (p *runPool) round(ctx context.Context, c *api.Client, hc *http.Client, overDC *dataplane.Peer, name string, id *identity.Identity, g coordinator.LeaseGrant, drop func(int) bool) error {
	js, err := c.Job(ctx, g.Job)
	if err != nil {
		return err
	}
	raw, err := c.GetBlob(ctx, js.Bundle)
	if err != nil {
		return err
	}
	var b fl.RoundBundle
	if err := content.Decode(raw, &b); err != nil {
		return err
	}
	if drop != nil && drop(b.Round) {
		return nil
	}
	raw, err = c.GetBlob(ctx, b.Run)
	if err != nil {
		return err
	}
	var canon fl.Canonical
	if err := content.Decode(raw, &canon); err != nil {
		return err
	}
	e, ok := p.cat.Lookup(string(b.Strategy))
	if !ok {
		return fmt.Errorf("strategy %s is not built in", b.Strategy.Short())
	}
	s, err := fl.NewStrategy(e, canon.Params())
	if err != nil {
		return err
	}
	raw, err = c.GetBlob(ctx, b.Global)
	if err != nil {
		return err
	}
	global, err := fl.DecodeGlobal(raw)
	if err != nil {
		return err
	}
	out, err := fl.ClientStep(ctx, script.Env{Catalog: p.cat, Seed: []byte(name)}, s.With(map[string]any{"round": int64(b.Round), "seed": b.Seed}),
		global, p.data[name], nil, fl.Privacy{})
	if err != nil {
		return err
	}
	input := b.Pack(out.Update, out.Metrics)
	p.mu.Lock()
	p.updates = append(p.updates, slices.Clone(input))
	p.mu.Unlock()
	reducer, ok := p.fed.Member(b.Reducer)
	if !ok {
		return fmt.Errorf("no reducer %q", b.Reducer)
	}
	var t transport.Transport = transport.HTTPS{Client: hc, Base: "https://" + reducer.Address}
	if overDC != nil {
		// No fallback: this silo's secure aggregation must go over the
		// data channel.
		t = &transport.DataChannel{Peer: overDC, Member: reducer.Name}
	}
	if err := wire.ParticipateOver(ctx, t, b.SecAgg, id.PrivateKey(), wire.Input{Values: input, Weight: out.Weight}); err != nil {
		return err
	}
	rec, err := content.Encode(contribution{Run: b.Run, Round: b.Round, Silo: name})
	if err != nil {
		return err
	}
	// Commit, upload and reveal, as a silo does.
	_, err = (&pool.Worker{Client: c, Name: name, Identity: id, Poll: 20 * time.Millisecond}).Deliver(ctx, g, rec, content.Hash(rec))
	return err
}

func (p *runPool) startSilos(drop map[string]func(int) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range p.silos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.runSilo(ctx, s, drop[s])
		}()
	}
	p.tb.Cleanup(func() { cancel(); wg.Wait() })
}

// waitRun waits until the run is no longer running.
func (p *runPool) waitRun(id content.Ref, d time.Duration) coordinator.RunStatus {
	p.tb.Helper()
	var st coordinator.RunStatus
	waitUntil(p.tb, "the run to end", slack(d), func() bool {
		var err error
		st, err = p.node.fsm.machine().Run(id)
		return err == nil && st.State != coordinator.RunRunning
	})
	return st
}

func (p *runPool) roundResult(ref content.Ref) (*fl.RoundResult, fl.Global) {
	p.tb.Helper()
	b, err := p.node.blobs.Get(ref)
	if err != nil {
		p.tb.Fatal(err)
	}
	r, g, err := fl.DecodeRoundResult(b)
	if err != nil {
		p.tb.Fatal(err)
	}
	return r, g
}

func fedavgSpec(rounds int) fl.RunSpec {
	return fl.RunSpec{
		Name: "fedavg-hospitals", Strategy: "fedavg", Params: map[string]any{"lr": 0.5, "epochs": int64(2)},
		Model: fl.ModelSpec{Kind: "logistic", Inputs: 0}, Dataset: "patients", Rounds: rounds, MinCohort: 3,
		SecureAgg: true, Seed: 7,
		// These tests play the silos themselves, training rounds only:
		// no statistics step (silo/ and cmd/scellis test that).
		Standardize: fl.StandardizeLocal,
	}
}

func TestRunTwoRoundsOverTheNetwork(t *testing.T) {
	rec := &apiRecorder{}
	p := newRunPool(t, 3, Options{WrapAPI: rec.wrap, P2PLoopback: true})
	// s1's secure aggregation goes over a data channel (its signalling
	// through the recorded API listener), the others' over HTTPS.
	p.p2pSilo = "s1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := fedavgSpec(2)
	spec.Model.Inputs = p.data["s1"].Dims()

	// A watcher on the run's event stream, through the API.
	var kinds []string
	var wmu sync.Mutex
	watchDone := make(chan error, 1)

	p.startSilos(nil)
	run, err := p.launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		watchDone <- p.client("alice").Watch(ctx, run, func(e api.Event) error {
			wmu.Lock()
			kinds = append(kinds, e.Kind)
			wmu.Unlock()
			return nil
		})
	}()
	st := p.waitRun(run, 25*time.Second)
	if st.State != coordinator.RunDone || len(st.Models) != 2 || len(st.Jobs) != 2 {
		t.Fatalf("run ended %+v", st)
	}
	if err := <-watchDone; err != nil {
		t.Fatalf("watch: %v", err)
	}
	wmu.Lock()
	if !slices.Contains(kinds, "round-complete") || kinds[len(kinds)-1] != "run-complete" {
		t.Errorf("run events %v", kinds)
	}
	wmu.Unlock()

	// The API reports the run as the machine does.
	c := p.client("alice")
	if got, err := c.Run(ctx, run); err != nil || got.State != coordinator.RunDone || len(got.Models) != 2 {
		t.Fatalf("GET /v1/runs/{id}: %+v, %v", got, err)
	}
	if all, err := c.Runs(ctx); err != nil || len(all) != 1 {
		t.Fatalf("GET /v1/runs: %+v, %v", all, err)
	}

	// Each round's document carries a new global model, from every silo.
	r0, g0 := p.roundResult(st.Models[0])
	r1, g1 := p.roundResult(st.Models[1])
	w0, _ := g0.Vector("w")
	w1, _ := g1.Vector("w")
	if r0.Model == r1.Model || r1.Previous != r0.Model || slices.Equal(w0, w1) {
		t.Errorf("the global model did not move: %s → %s (previous %s)", r0.Model.Short(), r1.Model.Short(), r1.Previous.Short())
	}
	if !slices.Equal(r1.Participants, p.silos) || len(r1.Dropped) != 0 || r1.Metrics["examples"] != float64(3*120) {
		t.Errorf("round 1: participants %v dropped %v metrics %v", r1.Participants, r1.Dropped, r1.Metrics)
	}
	// A cluster of one node: no second node recomputed the rounds, and
	// each result says so, citing the one node's signed digest.
	for _, r := range []*fl.RoundResult{r0, r1} {
		if c := r.Check; c == nil || c.Mode != fl.SelfOnly || len(c.Nodes) != 1 || c.Nodes[0].Node != p.node.Self.Name || c.Nodes[0].Digest == "" {
			t.Errorf("round %d of a one-node cluster: check %+v, want self-only with this node's digest", r.Round, c)
		}
	}
	if r0.Metrics["loss"] <= r1.Metrics["loss"] {
		t.Errorf("loss did not drop: %v then %v", r0.Metrics["loss"]/r0.Metrics["examples"], r1.Metrics["loss"]/r1.Metrics["examples"])
	}
	// Every shard was verified on its silo's contribution report: a receipt each.
	for _, j := range st.Jobs {
		js, _ := p.node.fsm.machine().Job(j)
		for _, s := range js.Shards {
			if s.State != coordinator.StateVerified {
				t.Errorf("round job %s shard %d (%s) is %s", js.Name, s.Index, s.Peer, s.State)
			}
		}
	}

	// s1's masked inputs went over its data channel (the node counts the
	// pair's bytes), and its secure aggregation took part in both rounds.
	var s1 dataplane.PairStats
	for _, ps := range p.node.dataPlaneStatus().Pairs {
		if ps.Peer == "s1" {
			s1 = ps
		}
	}
	if s1.Path != dataplane.PathDirect || s1.DirectBytes < int64(2*8*p.data["s1"].Dims()) {
		t.Errorf("agg-1's data-plane pair with s1: %+v, want direct with both rounds' masked inputs", s1)
	}

	// Law 3: no silo's update crossed the control-plane API, in any form.
	seen := windowSet{}
	for _, ex := range rec.snapshot() {
		seen.add(ex.req)
		seen.add(ex.resp)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.updates) != 6 {
		t.Fatalf("%d silo updates recorded, want 6", len(p.updates))
	}
	for i, u := range p.updates {
		b := make([]byte, 8*len(u))
		for k, v := range u {
			binary.BigEndian.PutUint64(b[8*k:], math.Float64bits(v))
		}
		cb, _ := content.Encode(u)
		for _, enc := range [][]byte{b, cb} {
			if where := leak(seen, enc, u); where != "" {
				t.Errorf("update %d crossed the control plane: %s", i, where)
			}
		}
	}
}

// A round with too few survivors is retried with backoff under new round
// IDs, then the run pauses (not stops) with the reason; a failure that
// heals (a silo that dropped out), so once the silo takes part again the
// leader resumes the run by itself (RunResumed, auto), from its last
// completed round, and it completes: nobody calls resume.
func TestRunRoundTooFewSurvivorsRetriesPausesResumes(t *testing.T) {
	t.Parallel()
	p := newRunPool(t, 3, Options{RoundAttempts: 2, RetryBackoff: 100 * time.Millisecond, SiloLease: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := fedavgSpec(2)
	spec.Model.Inputs = p.data["s1"].Dims()
	// s3 leases the first two attempts of round 0 and never takes part:
	// each fails (three sites are the minimum) and the second pauses the
	// run. It takes part in every attempt after. The attempts count once
	// the node's tenure is past its grace (an attempt planned before the
	// silos could have found a new leader does not).
	waitUntil(t, "the tenure's grace", 10*time.Second, func() bool { return p.node.leaderSince.Load() != 0 && !p.node.newTenure() })
	var dropped atomic.Int32
	events, stopEvents := p.node.hub.Subscribe("")
	defer stopEvents()
	p.startSilos(map[string]func(int) bool{"s3": func(int) bool { return dropped.Add(1) <= 2 }})
	run, err := p.launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// The run's pause and resume, in order, from the leader's events.
	var pause *coordinator.RunComplete
	var resumed *coordinator.RunResumed
	for resumed == nil {
		select {
		case <-ctx.Done():
			t.Fatalf("no automatic resume after the pause %+v", pause)
		case e, ok := <-events:
			if !ok {
				t.Fatal("the event subscription was dropped")
			}
			switch e := e.(type) {
			case coordinator.RunComplete:
				if e.Run == run && e.State == coordinator.RunPaused && pause == nil {
					pause = &e
					st, _ := p.node.fsm.machine().Run(run)
					if !st.Heals || st.RetryAt == 0 || st.Failures != 2 {
						t.Errorf("paused run %+v: want a pause that heals, with its retry time", st)
					}
					// Bad input: a member who is neither the owner
					// nor an operator (whatever the run's state).
					if _, err := p.client("s1").ResumeRun(ctx, run); err == nil || !strings.Contains(err.Error(), string(diag.PoolForbidden)) {
						t.Errorf("a silo resumed alice's run: %v", err)
					}
				}
			case coordinator.RunResumed:
				if e.Run == run {
					resumed = &e
				}
			}
		}
	}
	if pause == nil || !strings.Contains(pause.Reason, string(diag.SecAggTooFewSites)) {
		t.Fatalf("pause %+v does not carry the three-site diagnostic %s", pause, diag.SecAggTooFewSites)
	}
	if !resumed.Auto || resumed.Peer != p.node.Self.Name || resumed.Round != 0 {
		t.Errorf("resume %+v: want the leader's automatic resume at round 0", resumed)
	}
	st := p.waitRun(run, 40*time.Second)
	if st.State != coordinator.RunDone || len(st.Models) != 2 {
		t.Fatalf("after the automatic resume: %+v", st)
	}
	if len(st.Jobs) != 4 {
		t.Fatalf("%d round jobs, want 3 attempts of round 0 and round 1", len(st.Jobs))
	}
	rounds := map[string]bool{}
	for i, j := range st.Jobs[:3] {
		js, _ := p.node.fsm.machine().Job(j)
		if want := coordinator.JobAbandoned; i < 2 && js.State != want {
			t.Errorf("attempt %s is %s", j.Short(), js.State)
		}
		raw, _ := p.node.blobs.Get(js.Bundle)
		var b fl.RoundBundle
		if err := content.Decode(raw, &b); err != nil {
			t.Fatal(err)
		}
		rounds[b.SecAgg.Round] = true
	}
	if len(rounds) != 3 {
		t.Errorf("the attempts share a secure aggregation round ID")
	}
	if _, err := p.client("alice").ResumeRun(ctx, run); err == nil || !strings.Contains(err.Error(), string(diag.RunNotResumable)) {
		t.Errorf("resuming a done run: %v", err)
	}
	if _, err := p.client("alice").ResumeRun(ctx, content.Hash([]byte("no such run"))); err == nil {
		t.Errorf("resuming an unknown run succeeded")
	}
}

// A round that fails the same way on every attempt — here its server step,
// on a parameter the strategy refuses — pauses the run with the reason,
// and the pause does not heal by itself: the leader never resumes it,
// however alive its silos are (while a second run on the same silos
// completes), and refuses its own automatic resume of it; its submitter
// can resume it.
func TestRunFaultPauseWaitsForAPerson(t *testing.T) {
	t.Parallel()
	p := newRunPool(t, 3, Options{RoundAttempts: 2, RetryBackoff: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p.startSilos(nil)
	bad := fedavgSpec(2)
	bad.Name = "bad-server-lr"
	bad.Model.Inputs = p.data["s1"].Dims()
	bad.Params = map[string]any{"lr": 0.5, "epochs": int64(1), "server_lr": "fast"}
	run, err := p.launch(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	st := p.waitRun(run, 40*time.Second)
	if st.State != coordinator.RunPaused || st.Heals || !strings.Contains(st.Reason, "server step failed") {
		t.Fatalf("run %+v: want a pause that does not heal, on the server step", st)
	}
	good := fedavgSpec(1)
	good.Name = "good"
	good.Model.Inputs = p.data["s1"].Dims()
	other, err := p.launch(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	if o := p.waitRun(other, 40*time.Second); o.State != coordinator.RunDone {
		t.Fatalf("the second run: %+v", o)
	}
	again, _ := p.node.fsm.machine().Run(run)
	if again.State != coordinator.RunPaused || again.Reason != st.Reason || len(again.Jobs) != len(st.Jobs) {
		t.Fatalf("the paused run moved while its silos were alive: %+v, was %+v", again, st)
	}
	res, err := p.node.Apply(ctx, coordinator.ResumeRun{Run: run, Peer: p.node.Self.Name, Auto: true, Now: time.Now().UnixMilli()})
	if err != nil || len(res.Refusal) == 0 || res.Refusal[0].Code != diag.RunNotResumable {
		t.Fatalf("the leader's own resume of a pause that does not heal: %+v %v", res, err)
	}
	if _, err := p.client("alice").ResumeRun(ctx, run); err != nil {
		t.Fatalf("the submitter's resume: %v", err)
	}
	if _, err := p.client("alice").CancelRun(ctx, run, "fixing the spec"); err != nil {
		t.Fatal(err)
	}
}

// A silo that leases its round shard and never takes part is dropped at
// the advertising deadline; the round completes with the other three, and
// the run's record says who took part and who dropped.
func TestRunRoundDropoutOfFourCompletes(t *testing.T) {
	if testing.Short() {
		// It waits out the advertising deadline (seconds); under -short
		// TestRunRoundTooFewSurvivorsRetriesPausesResumes drives the same
		// leased-and-vanished silo, and secagg/wire the dropouts.
		t.Skip("waits out a secure aggregation deadline: runs without -short")
	}
	t.Parallel()
	p := newRunPool(t, 4, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := fedavgSpec(1)
	spec.Model.Inputs = p.data["s1"].Dims()
	p.startSilos(map[string]func(int) bool{"s2": func(int) bool { return true }})
	run, err := p.launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	st := p.waitRun(run, 25*time.Second)
	if st.State != coordinator.RunDone || len(st.Models) != 1 {
		t.Fatalf("run %+v", st)
	}
	r0, _ := p.roundResult(st.Models[0])
	if !slices.Equal(r0.Participants, []string{"s1", "s3", "s4"}) || !slices.Equal(r0.Dropped, []string{"s2"}) {
		t.Errorf("participants %v dropped %v", r0.Participants, r0.Dropped)
	}
	js, _ := p.node.fsm.machine().Job(st.Jobs[0])
	for _, s := range js.Shards {
		want := coordinator.StateVerified
		if s.Peer == "s2" {
			want = coordinator.StateUnverified
		}
		if s.State != want {
			t.Errorf("shard of %s is %s, want %s", s.Peer, s.State, want)
		}
	}
}

func TestLaunchRefusals(t *testing.T) {
	p := newRunPool(t, 3, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := fedavgSpec(1)
	spec.Model.Inputs = 4
	spec.Silos = []string{"s1", "s2", "alice"}
	if _, err := p.launch(ctx, spec); err == nil || !strings.Contains(err.Error(), string(diag.RunBadRound)) {
		t.Errorf("a worker in the cohort: %v", err)
	}
	spec.Silos = []string{"s1", "s2"}
	spec.MinCohort = 3
	if _, err := p.launch(ctx, spec); err == nil || !strings.Contains(err.Error(), string(diag.RunTooFewSites)) {
		t.Errorf("two silos: %v", err)
	}
	if _, err := p.client("alice").StartRun(ctx, api.RunRequest{Spec: content.Hash([]byte("nothing"))}); err == nil {
		t.Error("a run whose spec was never uploaded started")
	}
}
