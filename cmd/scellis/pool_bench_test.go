package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The pool at speed, measured the way a user meets it: the layout that
// `scellis federation init --aggregators 1 --workers 4` writes, unedited,
// real processes on loopback (an aggregator with its one-node Raft on
// disk, workers running shards in their sandbox children), jobs sent with
// `scellis job submit --watch`, and the same job run alone with `scellis
// run` in the same benchmark as the baseline. Each figure is one job's
// wall time from the submit command's start to the watch's end (compiling
// and uploading included), against the solo command's wall time.
//
//	go test -run '^$' -bench PoolProcesses -benchtime 3x ./cmd/scellis/
//
// Metrics: shards/s (the pool), solo-shards/s, pool/solo (pool wall ÷
// solo wall: above 1 the pool is slower) and, for CPU-bound shards,
// vs-solo-throughput (pool shards/s ÷ solo shards/s on the same cores).
//
// Under -short (CI runs every benchmark once that way) only the own
// federation starts, and only its one-worker cases run, with 200 trivial
// and 5 CPU-bound shards: the same commands, processes and paths.
func BenchmarkPoolProcesses(b *testing.B) {
	type load struct {
		name   string
		shards int
		burn   int // loop iterations per shard (0: trivial)
		short  int // shards under -short
	}
	trivial := load{"trivial", 2000, 0, 200}
	// About 20 ms of Starlark a shard on a current core.
	cpu := load{"cpu-20ms", 200, 60000, 5}
	for _, regime := range []string{"own", "consortium"} {
		workerCounts := []int{1, 2, 4}
		if regime == "consortium" {
			workerCounts = []int{4} // replicas 2: every shard runs twice
		}
		// Made here, not in a sub-benchmark: each sub-benchmark's clean-up
		// would stop it.
		short := testing.Short()
		var f *benchFederation
		if !short || regime == "own" {
			f = startBenchFederation(b, regime, 4)
		}
		started := 0
		for _, workers := range workerCounts {
			for _, l := range []load{trivial, cpu} {
				if regime == "consortium" && l.burn > 0 {
					continue
				}
				name := fmt.Sprintf("%s/workers=%d/%s", regime, workers, l.name)
				b.Run(name, func(b *testing.B) {
					if short && (f == nil || workers > 1) {
						b.Skip("-short: skipped (own/workers=1 runs the same commands)")
					}
					if short {
						l.shards = l.short
					}
					for ; started < workers; started++ {
						f.c.start(fmt.Sprintf("worker-%d", started+1), "worker", "--config", fmt.Sprintf("worker-%d/worker.yaml", started+1))
					}
					var pool, solo time.Duration
					for i := 0; i < b.N; i++ {
						dir := f.writeJob(l.shards, l.burn)
						solo += f.timed(b, "run", filepath.Join(dir, "job.yaml"), "--out", filepath.Join(dir, "solo"))
						pool += f.timed(b, "job", "submit", filepath.Join(dir, "job.yaml"), "--watch")
					}
					n := float64(l.shards * b.N)
					b.ReportMetric(0, "ns/op")
					b.ReportMetric(n/pool.Seconds(), "shards/s")
					b.ReportMetric(n/solo.Seconds(), "solo-shards/s")
					b.ReportMetric(pool.Seconds()/solo.Seconds(), "pool/solo")
					if l.burn > 0 {
						b.ReportMetric(solo.Seconds()/pool.Seconds(), "vs-solo-throughput")
					}
				})
			}
		}
		if f != nil {
			f.c.stopAll()
		}
	}
}

// benchFederation is a federation made by `scellis federation init` with
// its aggregator running.
type benchFederation struct {
	c    *cluster
	jobs int
}

func startBenchFederation(b *testing.B, regime string, workers int) *benchFederation {
	dir := b.TempDir()
	port := consecutivePorts(b, 2)
	mustRun(b, scellisCmd(b, dir, "federation", "init", "--dir", dir, "--aggregators", "1", "--workers", strconv.Itoa(workers),
		"--researcher", "alice", "--regime", regime, "--port", strconv.Itoa(port)))
	c := &cluster{t: b, dir: dir, aggs: []string{"agg-1"}, procs: map[string]*exec.Cmd{}, exits: map[string]chan struct{}{}}
	b.Cleanup(c.stopAll)
	c.start("agg-1", "aggregator", "--config", "agg-1/aggregator.yaml")
	c.waitLeader()
	return &benchFederation{c: c}
}

// writeJob writes a new sweep of n shards (a fresh salt: new job, new
// results), each burning burn loop iterations.
func (f *benchFederation) writeJob(n, burn int) string {
	f.jobs++
	dir := filepath.Join(f.c.dir, fmt.Sprintf("job-%d", f.jobs))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.c.t.Fatal(err)
	}
	prog := "def run(params, inputs):\n    return {\"v\": params[\"chunk\"], \"salt\": params[\"salt\"]}\n"
	if burn > 0 {
		prog = fmt.Sprintf("def run(params, inputs):\n    s = 0\n    for i in range(%d):\n        s += i * i\n    return {\"v\": params[\"chunk\"], \"salt\": params[\"salt\"], \"s\": s}\n", burn)
	}
	spec := fmt.Sprintf("name: bench\nprogram: ./p.star\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: concat\nparams: {salt: %d}\n", n, n, f.jobs)
	for name, body := range map[string]string{"p.star": prog, "job.yaml": spec} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			f.c.t.Fatal(err)
		}
	}
	return dir
}

// timed runs a client command as alice and returns its wall time.
func (f *benchFederation) timed(b *testing.B, args ...string) time.Duration {
	start := time.Now()
	f.c.mustCLI("alice", args...)
	return time.Since(start)
}
