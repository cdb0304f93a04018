package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
// CPU, steadier than wall time on a busy machine: pool-cpu-ms/shard (the
// aggregator's and the workers' processes, their children — the
// planning, reducing and shard children — and the submitting CLI),
// solo-cpu-ms/shard (the `scellis run` process and its children) and
// pool/solo-cpu.
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
					var pool, solo, poolCPU, soloCPU time.Duration
					for i := 0; i < b.N; i++ {
						dir := f.writeJob(l.shards, l.burn)
						wall, cpu := f.timed(b, "run", filepath.Join(dir, "job.yaml"), "--out", filepath.Join(dir, "solo"))
						solo, soloCPU = solo+wall, soloCPU+cpu
						before := f.daemonCPU()
						wall, cpu = f.timed(b, "job", "submit", filepath.Join(dir, "job.yaml"), "--watch")
						pool, poolCPU = pool+wall, poolCPU+cpu+f.daemonCPU()-before
					}
					n := float64(l.shards * b.N)
					b.ReportMetric(0, "ns/op")
					b.ReportMetric(n/pool.Seconds(), "shards/s")
					b.ReportMetric(n/solo.Seconds(), "solo-shards/s")
					b.ReportMetric(pool.Seconds()/solo.Seconds(), "pool/solo")
					b.ReportMetric(float64(poolCPU.Microseconds())/1e3/n, "pool-cpu-ms/shard")
					b.ReportMetric(float64(soloCPU.Microseconds())/1e3/n, "solo-cpu-ms/shard")
					b.ReportMetric(poolCPU.Seconds()/soloCPU.Seconds(), "pool/solo-cpu")
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

// timed runs a client command as alice and returns its wall time and
// the CPU time of its process and children. The benchmark reaps no other
// process meanwhile (its daemons run on), so the growth of this process's
// children's usage is the command's.
func (f *benchFederation) timed(b *testing.B, args ...string) (time.Duration, time.Duration) {
	cpu0 := childrenCPU(b)
	start := time.Now()
	f.c.mustCLI("alice", args...)
	return time.Since(start), childrenCPU(b) - cpu0
}

func childrenCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// daemonCPU is the CPU time the federation's running processes (the
// aggregator, the workers) and their children have used so far: each
// one's own, its reaped children's, and its live children's (a worker's
// shard children stay up between jobs, and their time reaches the
// worker's only once they exit), from /proc/PID/stat.
func (f *benchFederation) daemonCPU() time.Duration {
	daemons := map[int]bool{}
	for _, cmd := range f.c.procs {
		if cmd.Process != nil {
			daemons[cmd.Process.Pid] = true
		}
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, path := range stats {
		pid, ppid, t, ok := procTicks(path)
		if ok && (daemons[pid] || daemons[ppid]) {
			ticks += t
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// procTicks reads a /proc/PID/stat: the process's pid, its parent's, and
// its CPU time and its reaped children's (utime, stime, cutime, cstime)
// in clock ticks of 10 ms (USER_HZ is 100 on Linux).
func procTicks(path string) (pid, ppid int, ticks int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0, false // exited
	}
	// The pid, then the command name in parentheses (which may hold
	// spaces), then the fields: state first, ppid the 2nd, utime the 12th.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return 0, 0, 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b[:open])))
	fields := strings.Fields(string(b[end+1:]))
	if err != nil || len(fields) < 15 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	for _, i := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseInt(fields[i], 10, 64)
		ticks += v
	}
	return pid, ppid, ticks, true
}
