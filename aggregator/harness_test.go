package aggregator

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/pool"
	"github.com/scellis/scellis/trust"
)

// testPool is a one-node aggregator and its members, all in this process:
// real Raft on disk, real mutual TLS on 127.0.0.1, real pool.Workers.
// Member "agg-1" is the aggregator, "alice" submits, w1… execute.
type testPool struct {
	tb   testing.TB
	dir  string
	fed  *identity.Federation
	ids  map[string]*identity.Identity
	node *Node
	cat  *catalog.Catalog
	log  *syncBuffer // the node's operational log, shown when the test fails
	// noCommit: the node runs without commit–reveal, and so do the
	// workers (benchmarks measuring its cost).
	noCommit bool
	// shardTimeout and workerLog, when set, are the workers' ShardTimeout
	// and Logf.
	shardTimeout time.Duration
	workerLog    func(format string, args ...any)
	// parallel is each worker's Parallel (0: 1).
	parallel int
	// batch is each worker's Batch (0: one request per shard).
	batch int
	// p2p: workers move their blobs over data channels (dataplane) on
	// loopback; the node needs Options.P2PLoopback.
	p2p bool
}

// syncBuffer is a log sink safe for the node's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// claimedAddrs holds every address freeAddrs has handed out in this test
// process. Tests run in parallel: between freeAddrs closing its listener
// and a node binding the port, another test's freeAddrs could otherwise be
// given the same port.
var claimedAddrs = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// freeAddrs returns n distinct 127.0.0.1 ports that were free a moment
// ago and that no other test in this process was given: all listeners stay
// open until every port is chosen, so the kernel cannot hand out one port
// twice, and claimedAddrs keeps parallel tests apart.
func freeAddrs(tb testing.TB, n int) []string {
	tb.Helper()
	claimedAddrs.Lock()
	defer claimedAddrs.Unlock()
	var out []string
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		addr := l.Addr().String()
		if claimedAddrs.m[addr] {
			continue
		}
		claimedAddrs.m[addr] = true
		out = append(out, addr)
	}
	return out
}

// newTestPool generates identities for the aggregator, alice and workers
// w1..wN, and starts the node (see startTestNode).
func newTestPool(tb testing.TB, regime trust.Regime, workers int, opt Options) *testPool {
	tb.Helper()
	members := []testMember{{"alice", identity.Researcher}}
	for i := 1; i <= workers; i++ {
		members = append(members, testMember{fmt.Sprintf("w%d", i), identity.Worker})
	}
	return startTestNode(tb, regime, members, opt)
}

// testMember is one non-aggregator member of a test federation.
type testMember struct {
	name string
	role identity.Role
}

// startTestNode generates identities for agg-1 and members, writes the
// federation file as text, parses it, starts the node and waits until it
// leads. opt.Log defaults to a buffer, shown when the test fails.
func startTestNode(tb testing.TB, regime trust.Regime, members []testMember, opt Options) *testPool {
	tb.Helper()
	p := &testPool{tb: tb, dir: tb.TempDir(), ids: map[string]*identity.Identity{}, log: &syncBuffer{}, noCommit: opt.NoCommitReveal}
	var fed strings.Builder
	fmt.Fprintf(&fed, "federation: test\nregime: %s\nmembers:\n", regime)
	for _, m := range append([]testMember{{"agg-1", identity.Aggregator}}, members...) {
		id, err := identity.Generate()
		if err != nil {
			tb.Fatal(err)
		}
		p.ids[m.name] = id
		fmt.Fprintf(&fed, "  - name: %s\n    role: %s\n    public_key: %s\n", m.name, m.role, id.Public())
		if m.role == identity.Aggregator {
			addrs := freeAddrs(tb, 2)
			fmt.Fprintf(&fed, "    address: %s\n    raft_address: %s\n", addrs[0], addrs[1])
		}
	}
	f, err := identity.ParseFederation(filepath.Join(p.dir, "federation.yaml"), []byte(fed.String()))
	if err != nil {
		tb.Fatalf("federation:\n%s\n%v", fed.String(), err)
	}
	p.fed = f
	if p.cat, err = catalog.Builtin(); err != nil {
		tb.Fatal(err)
	}
	if opt.Log == nil {
		opt.Log = p.log
	}
	if opt.LogLevel == "" {
		opt.LogLevel = "warn"
	}
	if testing.Short() && opt.RaftHeartbeat == 0 && opt.RaftElection == 0 && opt.RaftLeaderLease == 0 {
		// agg-1 is the cluster's only voter: it elects itself after one
		// heartbeat timeout and, its own quorum, never loses the lease,
		// so the default second bought every test a second of waiting.
		// The full suite keeps the defaults (a node as deployed).
		opt.RaftHeartbeat, opt.RaftElection, opt.RaftLeaderLease = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	}
	n, err := Start("agg-1", p.ids["agg-1"], f, filepath.Join(p.dir, "agg-1"), opt)
	if err != nil {
		tb.Fatalf("starting the aggregator: %v", err)
	}
	p.node = n
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("closing the aggregator: %v", err)
		}
		if tb.Failed() {
			tb.Logf("--- aggregator log ---\n%s", p.log.String())
		}
	})
	waitUntil(tb, "the aggregator to lead and answer reads", 20*time.Second, func() bool {
		st := n.Status()
		return st.Raft.State == consensus.StateLeader && st.CaughtUp
	})
	return p
}

// waitUntil polls cond every few milliseconds until it holds, failing the
// test at the deadline. It waits on a ticker, not a sleep, and is for
// conditions that have no event to wait on.
func waitUntil(tb testing.TB, what string, d time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		case <-tick.C:
		}
	}
}

// client returns a control-plane client authenticating as member name.
func (p *testPool) client(name string) *api.Client {
	p.tb.Helper()
	c, err := api.NewClient(p.ids[name], p.fed)
	if err != nil {
		p.tb.Fatal(err)
	}
	return c
}

// startWorkers runs pool.Workers w1..wN (one shard at a time each) until
// the returned stop function is called; stop waits for them to hand their
// leases back and is also registered as a cleanup.
func (p *testPool) startWorkers(n int, poll time.Duration) (stop func()) {
	p.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("w%d", i)
		w := &pool.Worker{
			Client:   p.client(name),
			Name:     name,
			Identity: p.ids[name],
			NoCommit: p.noCommit,
			Catalog:  p.cat,
			CacheDir: filepath.Join(p.dir, name),
			Parallel: max(p.parallel, 1),
			Batch:    p.batch,
			Poll:     poll,

			ShardTimeout: p.shardTimeout,
			Logf:         p.workerLog,
		}
		if p.p2p {
			b, err := dataplane.StartMember(ctx, dataplane.MemberConfig{Identity: p.ids[name], Fed: p.fed, Name: name, Loopback: true, HTTPS: w.Client, Logf: p.workerLog})
			if err != nil {
				p.tb.Fatal(err)
			}
			w.Blobs = b
			// Blobs go over HTTPS until the channel is up, without
			// waiting for it: the tests that move blobs over data
			// channels (law 3's) wait for it here instead.
			select {
			case <-b.Connected():
			case <-time.After(30 * time.Second):
				p.tb.Fatalf("worker %s: no data channel to the pool within 30 s", name)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				p.tb.Errorf("worker %s: %v", name, err)
			}
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	p.tb.Cleanup(stop)
	return stop
}

// writeJob writes files (name → text) into a fresh folder and returns the
// path of its job.yaml.
func (p *testPool) writeJob(files map[string]string) string {
	p.tb.Helper()
	dir, err := os.MkdirTemp(p.dir, "job-")
	if err != nil {
		p.tb.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			p.tb.Fatal(err)
		}
	}
	return filepath.Join(dir, "job.yaml")
}

// piJob is the files of a Monte Carlo job: count samples in chunks shards,
// reduced to a weighted mean.
func piJob(name string, count, chunks int) map[string]string {
	return map[string]string{
		"job.yaml": fmt.Sprintf("name: %s\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: {use: mean, params: {weight: samples}}\n", name, count, chunks),
	}
}

// mustCompile writes files (as writeJob) and compiles the job, failing the
// test if it does not compile.
func (p *testPool) mustCompile(ctx context.Context, files map[string]string) *job.Plan {
	p.tb.Helper()
	plan, err := p.compile(ctx, p.writeJob(files))
	if err != nil {
		p.tb.Fatal(err)
	}
	return plan
}

// mustSubmit submits plan as alice (see submit), failing the test if it is
// refused.
func (p *testPool) mustSubmit(ctx context.Context, plan *job.Plan) {
	p.tb.Helper()
	if _, err := submit(ctx, p.client("alice"), p.fed, plan); err != nil {
		p.tb.Fatal(err)
	}
}

// startPiJob compiles piJob(name, count, chunks), starts workers native
// workers and submits the job as alice. It returns the plan and what stops
// the workers.
func (p *testPool) startPiJob(ctx context.Context, name string, count, chunks, workers int) (*job.Plan, func()) {
	p.tb.Helper()
	plan := p.mustCompile(ctx, piJob(name, count, chunks))
	stop := p.startWorkers(workers, 20*time.Millisecond)
	p.mustSubmit(ctx, plan)
	return plan, stop
}

// compile compiles a job file locally, as `scellis job submit` and
// `scellis run` do.
func (p *testPool) compile(ctx context.Context, path string) (*job.Plan, error) {
	spec, err := job.LoadSpec(path)
	if err != nil {
		return nil, err
	}
	return job.Compile(ctx, spec, p.cat)
}

// submit submits a compiled job the way `scellis job submit` does: admission
// checked locally, content and inputs uploaded to the blob endpoint, then
// the bundle, then only the bundle's ref through the control plane.
func submit(ctx context.Context, c *api.Client, fed *identity.Federation, plan *job.Plan) (coordinator.SubmitResponse, error) {
	if ds := trust.Admit(fed.Regime, plan.AdmissionRequest()); ds.HasErrors() {
		return coordinator.SubmitResponse{}, ds
	}
	sources, inputs := plan.Blobs()
	for ref, src := range sources {
		if _, err := c.PutBlob(ctx, src); err != nil {
			return coordinator.SubmitResponse{}, fmt.Errorf("uploading content %s: %w", ref.Short(), err)
		}
	}
	for ref, path := range inputs {
		b, err := os.ReadFile(path)
		if err != nil {
			return coordinator.SubmitResponse{}, err
		}
		if content.Hash(b) != ref {
			return coordinator.SubmitResponse{}, fmt.Errorf("input %s changed while submitting", path)
		}
		if _, err := c.PutBlob(ctx, b); err != nil {
			return coordinator.SubmitResponse{}, fmt.Errorf("uploading input %s: %w", path, err)
		}
	}
	bundle, err := content.Encode(plan.Bundle())
	if err != nil {
		return coordinator.SubmitResponse{}, err
	}
	bref, err := c.PutBlob(ctx, bundle)
	if err != nil {
		return coordinator.SubmitResponse{}, fmt.Errorf("uploading the bundle: %w", err)
	}
	resp, err := c.Submit(ctx, bref)
	if err != nil {
		return resp, err
	}
	if resp.Job != plan.ID {
		return resp, fmt.Errorf("the pool planned job %s, but this job is %s", resp.Job, plan.ID)
	}
	return resp, nil
}

// waitDone waits, on the node's own event hub (no polling), until job id
// is done: every shard decided and the reduced result reported. It returns
// the time the job was decided (all shards verified or flagged) as seen
// by this process, or the zero time if that happened before the call.
func (p *testPool) waitDone(ctx context.Context, id content.Ref) (decided time.Time, err error) {
	for {
		events, cancel := p.node.hub.Subscribe(id)
		// Subscribed first, then read the state: no event can fall between.
		st, err := p.node.fsm.machine().Job(id)
		if err == nil && st.State == coordinator.JobDone {
			cancel()
			return decided, nil
		}
		if err == nil && st.State == coordinator.JobDecided && decided.IsZero() {
			decided = time.Now()
		}
		dropped := false
		for !dropped {
			select {
			case <-ctx.Done():
				cancel()
				return decided, fmt.Errorf("job %s: %w", id.Short(), ctx.Err())
			case e, ok := <-events:
				if !ok {
					dropped = true // fell behind: subscribe again and re-read the state
					break
				}
				switch e.(type) {
				case coordinator.AllShardsDecided:
					if decided.IsZero() {
						decided = time.Now()
					}
				case coordinator.JobComplete:
					cancel()
					return decided, nil
				}
			}
		}
		cancel()
	}
}
