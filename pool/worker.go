package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/verify"
)

// Worker is a remote pool's executor: lease → run the shard in the sandbox
// → commit to the result → upload its bytes → reveal the hash once the
// shard's reveal is open (Deliver) → repeat.
// It renews leases while a shard runs, never runs more than Parallel shards
// at once, and hands its leases back when it stops.
type Worker struct {
	Client *api.Client
	// Blobs, when set, moves the worker's blobs (bundles, inputs,
	// results) in place of Client's HTTPS blob calls: the data plane
	// (dataplane.Blobs) uses a data channel to an aggregator and falls
	// back to HTTPS by itself. Either way every blob is hash-checked.
	Blobs BlobMover
	// Name is the worker's member name in the federation: commitments
	// bind a result to it (Deliver).
	Name string
	// Identity is the worker's federation identity: it signs every result
	// the worker reports (Deliver). Aggregators refuse unsigned reports.
	Identity    *identity.Identity
	Catalog     *catalog.Catalog // the worker's built-ins; other content is fetched by ref
	CacheDir    string
	Parallel    int
	MemoryBytes uint64 // per-shard memory budget for content; 0: the job's
	// ProcessMemoryBytes, when set, runs each shard in a child process
	// (internal/sandboxproc) whose address space may grow by at most this
	// much (RLIMIT_AS) and which is killed at ShardTimeout: the OS then
	// bounds the submitter's program, not only the in-sandbox guard. The
	// plan itself (partition, cost) still runs in this process.
	ProcessMemoryBytes uint64
	// ProcessNice, with ProcessMemoryBytes, runs the shard children at
	// this niceness (sandboxproc.Limits.Nice): a silo's generic shards
	// take only the CPU its training rounds leave. 0: the worker's own.
	ProcessNice  int
	ShardTimeout time.Duration
	// Batch, when above 1, lets the worker hold up to Batch leased shards
	// at once (leased in one request, run Parallel at a time) and send
	// their commitments and reports to the pool Batch at a time (POST
	// /v1/commits/batch and /v1/results/batch, their leases renewed with
	// /v1/renew/batch, small results uploaded with POST /blobs/batch when
	// blobs go over HTTPS): one request and one log entry for many
	// shards, each still checked and decided alone. For
	// short shards, where the per-shard round trips dominate. 1: one
	// request per shard. 0 (the default): adaptive (adaptive.go) — the
	// worker batches whatever is ready and leases ahead only as far as
	// its shards are short against their round trips, so long shards
	// are leased Parallel at a time as with 1.
	Batch int
	Poll  time.Duration
	// LongPoll, when set, makes every lease request a long poll: the
	// leader holds an empty request up to LongPoll and answers as soon as
	// a shard is leasable, so new work (the next training round) starts
	// at once instead of at the next poll. The polls are also the
	// worker's heartbeat (a silo's lease with the aggregator). Poll is
	// then only the pause after a failed request.
	LongPoll time.Duration
	// Corrupt makes every result wrong: a test switch showing that a lying
	// worker is out-voted and recorded. Never set in production.
	Corrupt bool
	// NoCommit reports results without commit–reveal; only a pool whose
	// coordinator runs without it accepts that (benchmarks). Never set in
	// production.
	NoCommit bool
	// Logf reports progress for people; nil is silent.
	Logf func(format string, args ...any)
	// Observe, when set, is told of each lease granted ("leased") and how
	// each shard run here ended ("reported", "refused", "released"): the
	// worker's metrics. It must not block.
	Observe func(event string)
	// Dispatch, when set, handles every leased grant in place of RunGrant.
	// It runs in its own goroutine, at most Parallel at once, and must
	// report or release the grant before it returns; ctx ends when the
	// worker stops.
	Dispatch func(ctx context.Context, g coordinator.LeaseGrant)
	// Lanes, when set, replace the worker's one lease loop (every kind,
	// Parallel shards, Dispatch) with one loop per lane, each asking for
	// its own kinds of shard (Lane): a silo's rounds and generic work.
	// A worker with lanes leases one request per shard (no Batch).
	Lanes []Lane

	// children keeps the shard children (ProcessMemoryBytes) of recent
	// jobs, each serving a run of shards (isolate.go).
	children sandboxproc.Pool
	// planning serialises compiling a job's bundle, so the shards of a
	// new job leased together compile it once.
	planning sync.Mutex
	// exec bounds the shards running at once to Parallel when Batch lets
	// more wait leased (Run).
	exec chan struct{}
	// courierOnce makes the couriers of a batching worker (courier.go).
	courierOnce sync.Once
	commits     *courier[api.CommitRequest, api.BatchItem]
	reports     *courier[outgoing, api.BatchItem]
	uploads     *courier[[]byte, content.Ref]
	renewals    *courier[api.RenewRequest, api.BatchItem]
	// keeper renews the leases held, in one loop (renew.go).
	keeper leaseKeeper

	mu       sync.Mutex
	plans    map[content.Ref]*job.Plan
	isolated map[content.Ref]*isolatedJob       // bundles kept for child processes
	policies map[content.Ref]coordinator.Policy // each job's verification policy (Deliver)
	// leased holds what lease responses said about jobs not compiled
	// yet (bundle, policy, delegation): plan reads it instead of the
	// job's status, and drops it once the job is compiled.
	leased map[content.Ref]coordinator.LeaseJob
	// subShards maps a sub-job (a child cluster's share of a parent
	// cluster's job, docs/tree.md) to the parent shard index of each of
	// its shards: its plan is the parent job's.
	subShards map[content.Ref][]int
	// outraced counts the reports in a row that the HTTPS upload won
	// while the report of the data-plane copy had no answer (report).
	outraced atomic.Int32
	// pace measures shards and round trips for the adaptive lease depth.
	pace pace
}

// isolatedJob is what a shard's child process needs of its job.
type isolatedJob struct {
	bundle []byte // the bundle's canonical bytes
	dir    string // its cache folder (inputs)
}

// BlobMover moves content-addressed blobs between a member and the pool.
// GetBlob returns bytes that hash to ref, or an error.
type BlobMover interface {
	GetBlob(ctx context.Context, ref content.Ref) ([]byte, error)
	PutBlob(ctx context.Context, b []byte) (content.Ref, error)
}

// blobs returns the worker's blob path: Blobs, or HTTPS through Client.
func (w *Worker) blobs() BlobMover {
	if w.Blobs != nil {
		return w.Blobs
	}
	return w.Client
}

func (w *Worker) observe(event string) {
	if w.Observe != nil {
		w.Observe(event)
	}
}

func (w *Worker) logf(format string, args ...any) {
	if w.Logf != nil {
		w.Logf(format, args...)
	}
}

// Lane is one lease loop of a worker: the shard kinds it asks for, how
// many of its shards it holds at once, and what handles them. A silo runs
// two (silo/appliance.go): one for its training rounds, which generic
// shards never occupy, and — only when its policy takes generic shards —
// one for generic work beside it. Each lane long-polls on its own, so a
// round reaches the silo at once however busy its generic lane is.
type Lane struct {
	// Kinds are the shard kinds the lane's lease requests ask for
	// (api.LeaseRequest.Kinds); empty: every kind.
	Kinds coordinator.Kinds
	// Parallel is how many of the lane's shards are held at once.
	Parallel int
	// Dispatch handles the lane's grants, as Worker.Dispatch does; nil:
	// Worker.Dispatch, or RunGrant.
	Dispatch func(ctx context.Context, g coordinator.LeaseGrant)
}

// Run works until ctx ends, then releases its leases and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	// Idle children: a few jobs' worth of Parallel each.
	w.children.MaxIdle = max(2*w.Parallel, 4)
	defer w.children.Close()
	var running sync.WaitGroup
	defer func() {
		running.Wait()
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.Client.Release(rctx, api.ReleaseRequest{}); err != nil {
			w.logf("releasing leases: %v", err)
		} else {
			w.logf("stopped; leases handed back")
		}
	}()
	lanes := w.Lanes
	if len(lanes) == 0 {
		lanes = []Lane{{Parallel: w.Parallel, Dispatch: w.Dispatch}}
	}
	var loops sync.WaitGroup
	for _, l := range lanes {
		loops.Add(1)
		go func() {
			defer loops.Done()
			w.leaseLoop(ctx, l, &running)
		}()
	}
	loops.Wait()
	return nil
}

// leaseLoop leases the lane's shards and hands each to its dispatcher in
// a goroutine counted in running, until ctx ends.
func (w *Worker) leaseLoop(ctx context.Context, lane Lane, running *sync.WaitGroup) {
	parallel := max(lane.Parallel, 1)
	// free is how many shards to ask for, and of how many; 0 of any:
	// wait until a held shard is done.
	free := func(held int) (int, int) { return parallel - held, parallel }
	switch {
	case w.adaptive():
		// Leased ahead as far as the shards are short (adaptive.go).
		w.exec = make(chan struct{}, parallel)
		w.pace.ran1 = make(chan struct{}, 1)
		run := parallel
		parallel = max(maxAdaptiveHeld, run)
		free = func(held int) (int, int) {
			d := w.pace.depth(run)
			return max(min(d-int(w.pace.queued.Load()), parallel-held), 0), d
		}
	case w.Dispatch == nil && len(w.Lanes) == 0 && w.Batch > parallel:
		// Up to Batch shards leased and waiting, Parallel running.
		w.exec = make(chan struct{}, parallel)
		parallel = w.Batch
	}
	dispatch := lane.Dispatch
	if dispatch == nil {
		dispatch = w.RunGrant
	}
	poll := w.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	slots := make(chan struct{}, parallel)
	freed := make(chan struct{}, 1) // a slot was freed since the last look
	failures, lastErr := 0, ""      // lease requests failed in a row, and the last error
	for ctx.Err() == nil {
		free, of := free(len(slots))
		// A batching worker leases again once half its batch is free
		// (or all of it is done), so its leases come in few large
		// requests rather than one per finished shard.
		if free == 0 || (w.exec != nil && free < of/2 && free < of) {
			select {
			case <-ctx.Done():
				return
			case <-freed:
			case <-w.pace.ran1: // nil unless adaptive
			}
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second+w.LongPoll)
		asked := time.Now()
		resp, err := w.Client.Lease(lctx, api.LeaseRequest{Max: free, RequestID: requestID(), WaitMS: int(w.LongPoll.Milliseconds()), Kinds: lane.Kinds})
		cancel()
		if err == nil && len(resp.Grants) > 0 {
			w.pace.leased(time.Since(asked))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A pool that keeps refusing (down, or this key revoked) is
			// asked less and less often, and the log says so now and then
			// rather than at every poll.
			failures++
			if msg := err.Error(); msg != lastErr || failures%20 == 0 {
				w.logf("lease: %v (failed %d time(s) in a row; retrying with backoff)", err, failures)
				lastErr = msg
			}
			sleep(ctx, min(poll<<min(failures-1, 6), 5*time.Second))
			continue
		}
		failures, lastErr = 0, ""
		w.noteJobs(resp.Jobs)
		if len(resp.Grants) == 0 {
			if w.LongPoll <= 0 || time.Since(asked) < w.LongPoll/2 {
				// Not held (a plain poll, or a node that does not hold):
				// do not ask again in a hot loop.
				sleep(ctx, poll)
			}
			continue
		}
		for _, g := range resp.Grants {
			w.observe("leased")
			if w.adaptive() {
				w.pace.queued.Add(1) // until RunGrant has run it
			}
			slots <- struct{}{}
			running.Add(1)
			go func(g coordinator.LeaseGrant) {
				defer running.Done()
				defer func() {
					<-slots
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
				dispatch(ctx, g)
			}(g)
		}
	}
}

func requestID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// noteJobs keeps what a lease response said about its jobs, for plan.
func (w *Worker) noteJobs(jobs []coordinator.LeaseJob) {
	if len(jobs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range jobs {
		if _, compiled := w.plans[l.Job]; compiled {
			continue
		}
		if w.leased == nil {
			w.leased = map[content.Ref]coordinator.LeaseJob{}
		}
		w.leased[l.Job] = l
	}
}

// TakeLeased returns, and forgets, what the lease response that granted
// a shard of job said about it (false when it said nothing): a Dispatch
// that handles its own shards (a silo's rounds) reads it instead of the
// job's status.
func (w *Worker) TakeLeased(job content.Ref) (coordinator.LeaseJob, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.leased[job]
	delete(w.leased, job)
	return l, ok
}

// jobInfo is what plan needs of a job's status: from the lease that
// granted its shard when the pool sent it, else read from the pool.
func (w *Worker) jobInfo(ctx context.Context, id content.Ref) (coordinator.LeaseJob, error) {
	w.mu.Lock()
	l, ok := w.leased[id]
	w.mu.Unlock()
	if ok {
		return l, nil
	}
	st, err := w.Client.Job(ctx, id)
	if err != nil {
		return coordinator.LeaseJob{}, err
	}
	return coordinator.LeaseJob{Job: st.ID, Bundle: st.Bundle, Policy: st.Policy, Delegated: st.Delegated}, nil
}

// plan compiles a job's bundle once per worker, checking it is the job
// the coordinator named.
func (w *Worker) plan(ctx context.Context, id content.Ref) (*job.Plan, error) {
	w.mu.Lock()
	if p, ok := w.plans[id]; ok {
		w.mu.Unlock()
		return p, nil
	}
	w.mu.Unlock()
	w.planning.Lock()
	defer w.planning.Unlock()
	w.mu.Lock()
	if p, ok := w.plans[id]; ok { // compiled while this call waited
		w.mu.Unlock()
		return p, nil
	}
	w.mu.Unlock()
	st, err := w.jobInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	// A sub-job runs the parent job's plan: its bundle compiles to the
	// parent job, and its shard i is the parent's shard Shards[i] — or,
	// deeper in a tree, the root job's shard RootShards[i] (Plan).
	want := id
	if d := st.Delegated; d != nil {
		job, shards := d.Plan()
		if !content.IsRef(string(job)) {
			return nil, fmt.Errorf("sub-job %s names parent job %.80q, not a ref", id.Short(), job)
		}
		want = job
		w.mu.Lock()
		p, ok := w.plans[want]
		if w.subShards == nil {
			w.subShards = map[content.Ref][]int{}
		}
		w.subShards[id] = shards
		if ok {
			w.plans[id], w.isolated[id] = p, w.isolated[want]
			delete(w.leased, id)
		}
		w.mu.Unlock()
		if ok {
			w.setPolicy(id, st.Policy)
			return p, nil
		}
	}
	raw, err := w.blobs().GetBlob(ctx, st.Bundle)
	if err != nil {
		return nil, fmt.Errorf("fetching bundle: %w", err)
	}
	var b job.Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", st.Bundle.Short(), err)
	}
	if !content.IsRef(string(id)) {
		return nil, fmt.Errorf("job ID %.80q is not a ref", id)
	}
	dir := filepath.Join(w.CacheDir, id.Hex()[:16])
	fetch := func(ctx context.Context, ref content.Ref) ([]byte, error) { return w.blobs().GetBlob(ctx, ref) }
	p, err := job.CompileBundle(ctx, &b, w.Catalog, fetch, dir)
	if err != nil {
		return nil, err
	}
	if p.ID != want {
		return nil, fmt.Errorf("bundle compiles to job %s, not %s: refusing to work on it", p.ID.Short(), want.Short())
	}
	p.CapMemory(w.MemoryBytes)
	w.mu.Lock()
	if w.plans == nil {
		w.plans = map[content.Ref]*job.Plan{}
		w.isolated = map[content.Ref]*isolatedJob{}
	}
	w.plans[id], w.plans[want] = p, p
	w.isolated[id] = &isolatedJob{bundle: raw, dir: dir}
	w.isolated[want] = w.isolated[id]
	delete(w.leased, id)
	w.mu.Unlock()
	w.setPolicy(id, st.Policy)
	return p, nil
}

// ReleaseGrant hands one lease back so another peer (or this one, later)
// can take the shard, logging why.
func (w *Worker) ReleaseGrant(g coordinator.LeaseGrant, why error) {
	w.observe("released")
	w.logf("shard %d of %s: %v; handing the lease back", g.Shard, g.Job.Short(), why)
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.Client.Release(rctx, api.ReleaseRequest{Shards: []coordinator.ShardRef{{Job: g.Job, Shard: g.Shard}}})
}

// RunGrant executes one leased generic shard and reports it; on any
// failure the lease is handed back so another peer can take the shard.
func (w *Worker) RunGrant(ctx context.Context, g coordinator.LeaseGrant) {
	dequeued := !w.adaptive()
	dequeue := func() { // the shard has run (or will not): out of the adaptive queue
		if !dequeued {
			dequeued = true
			w.pace.dequeued()
		}
	}
	defer dequeue()
	release := func(why error) { w.ReleaseGrant(g, why) }
	p, err := w.plan(ctx, g.Job)
	if err != nil {
		release(err)
		return
	}
	idx := w.planIndex(g)
	if idx < 0 || idx >= len(p.Shards) || p.Shards[idx].ID != g.ShardID {
		release(errors.New("the lease names a shard this job does not have"))
		return
	}
	sh := p.Shards[idx]

	timeout := w.ShardTimeout
	if w.exec != nil {
		timeout = 0 // counted from when the shard starts running, below
	}
	runCtx, stop := w.Renewing(ctx, g, timeout)
	if w.exec != nil {
		// Leased ahead (Batch): wait for a free run slot, the lease
		// renewed meanwhile.
		select {
		case w.exec <- struct{}{}:
		case <-runCtx.Done():
			stop()
			release(fmt.Errorf("no run slot before the lease ended: %w", runCtx.Err()))
			return
		}
		if w.ShardTimeout > 0 {
			var cancel context.CancelFunc
			runCtx, cancel = context.WithTimeout(runCtx, w.ShardTimeout)
			defer cancel()
		}
	}
	var res *job.Result
	started := time.Now()
	if w.ProcessMemoryBytes > 0 {
		res, err = w.executeIsolated(runCtx, p, sh)
	} else {
		res, err = p.Execute(runCtx, sh)
	}
	ran := time.Since(started)
	if w.exec != nil {
		<-w.exec // the next leased shard may run while this one is delivered
	}
	dequeue()
	if err == nil {
		w.pace.shard(ran)
	}
	stop()
	if err != nil {
		// Timed out, failed, or the worker is stopping (SIGINT): either
		// way the shard goes back, so another peer need not wait for the
		// lease to lapse.
		release(err)
		return
	}
	if w.Corrupt {
		var wrong any = map[string]any{"corrupted": res.Value}
		if p.Tier() == verify.Convergent {
			// Same shape, numbers off by 0.1%: a cheater the convergent
			// tier's tolerance, not a shape check, must catch.
			wrong = nudge(res.Value)
		}
		if res, err = job.NewResult(sh, wrong); err != nil {
			release(err)
			return
		}
	}
	out, err := w.Deliver(ctx, g, res.Bytes, res.Hash)
	if err != nil {
		if ds, ok := diag.As(err); ok {
			w.observe("refused")
			w.logf("shard %d of %s: report refused: %s", g.Shard, g.Job.Short(), ds[0].Message)
			return
		}
		if ctx.Err() == nil {
			release(fmt.Errorf("delivering the result: %w", err))
		}
		return
	}
	w.observe("reported")
	if ran >= longShard {
		w.logf("shard %d of %s: reported %s (%s)", g.Shard, g.Job.Short(), res.Hash.Short(), out.Outcome)
	} else {
		// Short shards, hundreds a second, get no line each: one message
		// per job and outcome, which the log's summariser writes once and
		// then counts ("×2400 in the last minute"); the worker's metrics
		// count every shard.
		w.logf("shards of %s: reported (%s)", g.Job.Short(), out.Outcome)
	}
}

// longShard is the run time from which a worker logs each shard it
// reports on its own line.
const longShard = time.Second

// planIndex is the index in the job's plan of g's shard: g.Shard, or for
// a sub-job the parent shard it stands for (-1 when out of range).
func (w *Worker) planIndex(g coordinator.LeaseGrant) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	sub, ok := w.subShards[g.Job]
	if !ok {
		return g.Shard
	}
	if g.Shard < 0 || g.Shard >= len(sub) {
		return -1
	}
	return sub[g.Shard]
}

// nudge returns v with every float scaled by 1.001 (a test cheater's lie).
func nudge(v any) any {
	switch x := v.(type) {
	case float64:
		return x * 1.001
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = nudge(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = nudge(e)
		}
		return out
	}
	return v
}
