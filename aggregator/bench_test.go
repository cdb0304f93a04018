package aggregator

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/pool"
	"github.com/scellis/scellis/trust"
)

// Pool throughput: shards per second through the whole remote pipeline —
// submit, plan on the aggregator, lease, run in the sandbox, upload the
// result to the blob endpoint, report its hash, verify, mint the receipt,
// reduce — with a trivial program, so what is measured is the pool's
// per-shard overhead. Everything is real and in this process: a one-node
// Raft on disk, mutual TLS on loopback, pool.Workers running one shard at a
// time each (and, in one case, eight). The baseline is the solo executor (pool.Local, one shard per
// CPU) on the same jobs, measured in the same run; each pool figure is also
// reported as a ratio to it (vs-solo).
//
//	go test -run '^$' -bench . -benchtime 3x ./aggregator/
//
// A -bench pattern with more levels than "solo" has (such as
// 'PoolShards/(solo|own)$/replicas=1/workers=4') matches solo only in
// part: Go then runs it once, with b.N = 1, and does not print it, so
// vs-solo is against one solo job.
//
// Under -short (CI runs every benchmark once that way, so a broken one
// fails CI) only the pool marked short runs (several workers, parallel,
// batch); BenchmarkPoolCommitReveal's short case runs
// consortium/replicas=2/workers=2 with adaptive batching. The others,
// each a node of its own, skip.

const (
	benchShards = 200
	benchPoll   = 20 * time.Millisecond
	benchTTL    = 2 * time.Second
	// benchBatch is a batching worker's Batch: a worker's share of a
	// 200-shard job among four.
	benchBatch = 50
)

// benchProgram does almost nothing; its result carries the job's salt so
// every job's results are new blobs (a stored blob is not written again).
const benchProgram = "def run(params, inputs):\n    return {\"v\": params[\"chunk\"], \"salt\": params[\"salt\"]}\n"

// benchJob returns a fresh 200-shard job: salt changes its ID and results.
func benchJob(p *testPool, salt int) string {
	return p.writeJob(map[string]string{
		"p.star": benchProgram,
		"job.yaml": fmt.Sprintf("name: trivial\nprogram: ./p.star\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: concat\nparams: {salt: %d}\n",
			benchShards, benchShards, salt),
	})
}

func BenchmarkPoolShards(b *testing.B) {
	var solo float64 // shards/s of the pool of one, measured first
	b.Run("solo", func(b *testing.B) { solo = benchSolo(b, false) })
	b.Run("solo-verify", func(b *testing.B) { benchSolo(b, true) })
	for _, c := range []struct {
		regime   trust.Regime
		workers  int
		parallel int
		batch    int
		short    bool // runs under -short
	}{
		// Workers as configured by default (worker.yaml batch unset:
		// adaptive, pool/adaptive.go) — replicas 1: the main figure.
		{trust.Own, 1, 1, 0, false}, {trust.Own, 2, 1, 0, false}, {trust.Own, 4, 1, 0, false},
		// batch: 1, one request per shard (the default before adaptive
		// batching).
		{trust.Own, 4, 1, 1, false},
		// Workers that keep several shards in flight (worker.yaml
		// parallel): their uploads share blob fsyncs (group commit) and
		// their leases and reports share log entries.
		{trust.Own, 4, 8, 1, false},
		// Batching workers (worker.yaml batch): each leases up to batch
		// shards at once, runs them parallel at a time, and sends their
		// commitments and reports batch at a time (one request, one log
		// entry for many shards).
		{trust.Own, 1, 1, benchBatch, false}, {trust.Own, 4, 1, benchBatch, false}, {trust.Own, 4, 2, benchBatch, true},
		{trust.Consortium, 2, 1, 0, false}, {trust.Consortium, 4, 1, 0, false}, // replicas 2: every shard runs twice
		{trust.Consortium, 4, 1, 1, false}, {trust.Consortium, 4, 1, benchBatch, false},
	} {
		name := fmt.Sprintf("%s/replicas=%d/workers=%d", c.regime, coordinator.DefaultReplicas(c.regime), c.workers)
		if c.parallel > 1 {
			name += fmt.Sprintf("/parallel=%d", c.parallel)
		}
		if c.batch >= 1 {
			name += fmt.Sprintf("/batch=%d", c.batch)
		}
		b.Run(name, func(b *testing.B) {
			if testing.Short() && !c.short {
				b.Skip("-short: skipped (the short pools cover its options)")
			}
			rate := benchPool(b, c.regime, c.workers, Options{}, c.parallel, c.batch)
			if solo > 0 {
				b.ReportMetric(rate/solo, "vs-solo")
			}
		})
	}
}

// The cost of commit–reveal (law 13): the same pools with it (as
// aggregators always run) and without it (results reported outright, which
// lets a member copy another's hash), in one run; "vs-no-commit" is the
// ratio of the two rates. With it a result of a job of two or more
// replicas takes two writes (commit, then reveal) instead of one, and a
// peer may wait up to one lease TTL for the shard's other replica to
// commit; a one-replica job skips the commitment (its first report
// decides), so its ratio measures only noise and the per-job policy read.
//
//	go test -run '^$' -bench PoolCommitReveal -benchtime 3x ./aggregator/
//
// Under -short only consortium/replicas=2/workers=2 runs, the smallest
// pool whose shards are committed before they are revealed.
func BenchmarkPoolCommitReveal(b *testing.B) {
	for _, c := range []struct {
		regime  trust.Regime
		workers int
	}{{trust.Own, 2}, {trust.Consortium, 2}, {trust.Consortium, 4}} {
		var off float64
		name := fmt.Sprintf("%s/replicas=%d/workers=%d", c.regime, coordinator.DefaultReplicas(c.regime), c.workers)
		skip := func(b *testing.B) {
			if testing.Short() && (c.regime != trust.Consortium || c.workers > 2) {
				b.Skip("-short: skipped (consortium/replicas=2/workers=2 runs commit-reveal)")
			}
		}
		b.Run(name+"/commit-reveal=off", func(b *testing.B) {
			skip(b)
			off = benchPool(b, c.regime, c.workers, Options{NoCommitReveal: true}, 1, 0)
		})
		b.Run(name+"/commit-reveal=on", func(b *testing.B) {
			skip(b)
			if rate := benchPool(b, c.regime, c.workers, Options{}, 1, 0); off > 0 {
				b.ReportMetric(rate/off, "vs-no-commit")
			}
		})
	}
}

// benchSolo runs fresh jobs through the pool of one: compile, execute every
// shard (twice with verify), reduce. It returns shards/s.
func benchSolo(b *testing.B, verify bool) float64 {
	p := &testPool{tb: b, dir: b.TempDir()}
	var err error
	if p.cat, err = catalog.Builtin(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	jobs := 0
	for b.Loop() {
		jobs++
		plan, err := p.compile(ctx, benchJob(p, jobs))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := (&pool.Local{Verify: verify}).Run(ctx, plan); err != nil {
			b.Fatal(err)
		}
	}
	rate := float64(benchShards*jobs) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "shards/s")
	return rate
}

// benchPool runs fresh jobs through a one-node aggregator and n workers,
// each job from local compile and submission to done (reduced), and
// returns shards/s. It also reports how long the job took from its last
// shard decided to done (the reducer peer's latency: the leader looks for
// decided jobs every 200ms), and the rate without it.
func benchPool(b *testing.B, regime trust.Regime, workers int, opt Options, parallel, batch int) float64 {
	opt.LeaseTTL = benchTTL
	p := newTestPool(b, regime, workers, opt)
	p.parallel = parallel
	p.batch = batch
	p.startWorkers(workers, benchPoll)
	alice := p.client("alice")
	jobs := 0
	var reduceWait time.Duration
	cpu0, child0 := cpuTime(), childCPUTime()
	for b.Loop() {
		jobs++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		plan, err := p.compile(ctx, benchJob(p, jobs))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := submit(ctx, alice, p.fed, plan); err != nil {
			b.Fatalf("submit: %v", err)
		}
		decided, err := p.waitDone(ctx, plan.ID)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if !decided.IsZero() {
			reduceWait += time.Since(decided)
		}
		checkBenchJob(b, p, plan)
	}
	elapsed := b.Elapsed()
	// CPU of this process (aggregator and workers, not the planning and
	// reducing children) per shard: steadier than the rate on a busy
	// machine.
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1e3/float64(benchShards*jobs), "cpu-ms/shard")
	// CPU of the planning and reducing children (those that ended), per
	// job: the per-job fixed cost the rate above leaves out.
	b.ReportMetric(float64((childCPUTime()-child0).Microseconds())/1e3/float64(jobs), "child-cpu-ms/job")
	rate := float64(benchShards*jobs) / elapsed.Seconds()
	b.ReportMetric(rate, "shards/s")
	// Without the reducer's latency: lease → run → upload → report →
	// verify → receipt only.
	b.ReportMetric(float64(benchShards*jobs)/(elapsed-reduceWait).Seconds(), "decided-shards/s")
	b.ReportMetric(float64(reduceWait.Milliseconds())/float64(jobs), "ms-decided-to-done")
	return rate
}

// childCPUTime is the CPU time of this process's children that have
// ended and been waited for (the sandbox children of the planner).
func childCPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// checkBenchJob fails the benchmark unless every shard was verified by as
// many peers as the regime asks and the job was reduced: a fast wrong pool
// is not measured.
func checkBenchJob(b *testing.B, p *testPool, plan *job.Plan) {
	st, err := p.node.fsm.machine().Job(plan.ID)
	if err != nil {
		b.Fatal(err)
	}
	if st.State != coordinator.JobDone || st.Counts.Verified != benchShards || st.Reduced == "" {
		b.Fatalf("job %s: %s, %d/%d verified", plan.ID.Short(), st.State, st.Counts.Verified, benchShards)
	}
	want := coordinator.DefaultReplicas(p.fed.Regime)
	for _, s := range st.Shards {
		if len(s.Agreeing) != want {
			b.Fatalf("shard %d verified by %v; want %d peers", s.Index, s.Agreeing, want)
		}
	}
}
