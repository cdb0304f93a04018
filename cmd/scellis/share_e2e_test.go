package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/fl"
)

// sharedFederation is the README's federation doing two things at once:
// four hospitals configured from its hospital-a.yaml — two whose policy
// takes generic shards (generic_shards: true), two that keep the README's
// false — two workers, and a researcher who runs the README's training run
// (12 rounds here) while a 120-shard sweep runs on the same pool. Every
// silo serves /metrics.
type sharedFederation struct {
	c       *cluster
	generic []string          // silos whose policy takes generic shards
	rounds  []string          // silos that take training rounds alone
	metrics map[string]string // silo → its metrics_listen address
	nRounds int               // the training run's rounds
	nShards int               // the sweep's shards: a multiple of 12
	sweeps  int
	runs    int
}

// The sizes: a 12-round training run, a 120-shard sweep.
const (
	sharedRounds = 12
	sharedShards = 120
)

// startSharedFederation starts the federation for runs of rounds rounds
// and sweeps of shards shards (a multiple of 12, at most 120).
func startSharedFederation(t testing.TB, rounds, shards int) *sharedFederation {
	if shards%12 != 0 || shards < 12 || shards > 120 {
		t.Fatalf("a sweep of %d shards: the grid is 12 learning rates × up to 10 penalties", shards)
	}
	f := &sharedFederation{generic: []string{"hospital-a", "hospital-b"}, rounds: []string{"hospital-c", "hospital-d"}, metrics: map[string]string{},
		nRounds: rounds, nShards: shards}
	silos := append(append([]string{}, f.generic...), f.rounds...)
	ms := append([]member{{"w1", "worker"}, {"w2", "worker"}, {"alice", "researcher"}}, siloMembers(silos)...)
	c := newCluster(t, "consortium", 1, ms...)
	f.c = c
	// Deadlines far above a busy machine's pauses: a round that leaves a
	// silo out, or is tried again, says something waited on generic work
	// (or on nothing at all), never that the test machine was slow.
	c.write("agg-1.yaml", "name: agg-1\nidentity: agg-1/identity.key\nfederation: federation.yaml\ndata_dir: agg-1/data\nlease_ttl: 10s\nround_join_timeout: 30s\nlog_level: error\n")
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "800", "--seed", "11", "--out", "data"))
	pp := &ports{t: t}
	for i, s := range silos {
		y := readmeSilo(t, s, i+1)
		// Budgets and a daily cap for many runs (a benchmark's); the
		// README's policy otherwise, generic shards as the silo's role.
		y = strings.Replace(y, "epsilon: 8,", "epsilon: 100000,", 1)
		y = strings.Replace(y, "max_rounds_per_day: 24", "max_rounds_per_day: 100000", 1)
		if i < len(f.generic) {
			y = strings.Replace(y, "generic_shards: false", "generic_shards: true", 1)
		}
		if !strings.Contains(y, "epsilon: 100000,") || !strings.Contains(y, "max_rounds_per_day: 100000") || !strings.Contains(y, "generic_shards: ") {
			t.Fatalf("the README's hospital-a.yaml changed; adapt this test:\n%s", y)
		}
		f.metrics[s] = pp.next()
		c.write(s+".yaml", y+"metrics_listen: "+f.metrics[s]+"\n")
	}
	pp.release()
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	// The workers stand for machines of their own: at the lowest CPU
	// priority here, their shards do not take the cores of the silos and
	// the aggregator, whose sharing is what is measured.
	c.nice = map[string]int{"w1": 19, "w2": 19}
	c.startWorker("w1")
	c.startWorker("w2")
	return f
}

// writeSweep writes a new sweep of nShards shards (train-eval over a grid
// of 12 learning rates × nShards/12 penalties on site 1's rows; its seed
// makes each one a new job) and returns its file.
func (f *sharedFederation) writeSweep() string {
	f.sweeps++
	l2 := []string{"0.0", "0.0001", "0.0003", "0.001", "0.003", "0.01", "0.03", "0.1", "0.3", "1.0"}[:f.nShards/12]
	name := fmt.Sprintf("sweep-%d.yaml", f.sweeps)
	f.c.write(name, fmt.Sprintf(`name: sweep%d
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5], l2: [%s]}
reducer: {use: collect, params: {metric: auc, goal: max}}
params: {model: logistic, epochs: 1000, batch_size: 32, test_frac: 0.3, seed: %d}
inputs:
  data: {path: data/hospital-1.csv, label: outcome, class: confidential}
`, f.nShards, strings.Join(l2, ", "), f.sweeps))
	return name
}

// writeRun writes the README's run.yaml with nRounds rounds (its name
// makes each one a new run) and returns its file.
func (f *sharedFederation) writeRun(t testing.TB) string {
	f.runs++
	y := readmeBlock(t, "run.yaml")
	y = strings.Replace(y, "rounds: 10", "rounds: "+strconv.Itoa(f.nRounds), 1)
	y = strings.Replace(y, "name: fedprox-hospitals", fmt.Sprintf("name: fedprox-hospitals-%d", f.runs), 1)
	if !strings.Contains(y, "rounds: "+strconv.Itoa(f.nRounds)) || !strings.Contains(y, fmt.Sprintf("name: fedprox-hospitals-%d", f.runs)) {
		t.Fatalf("the README's run.yaml changed; adapt this test:\n%s", y)
	}
	name := fmt.Sprintf("run-%d.yaml", f.runs)
	f.c.write(name, y)
	return name
}

// runToEnd launches the run in file, follows it with `fl watch` and
// returns its status and its training rounds as `fl watch --json` shows
// them.
func (f *sharedFederation) runToEnd(t testing.TB, file string) (runView, []fl.RoundSummary) {
	id := strings.TrimSpace(f.c.mustCLI("alice", "fl", "launch", file))
	if out, errs, err := f.c.cli("alice", "fl", "watch", id); err != nil {
		t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
	}
	st := f.c.run(id)
	if st.State != "done" {
		t.Fatalf("the run did not end done: %+v", st)
	}
	var train []fl.RoundSummary
	for _, line := range strings.Split(strings.TrimSpace(f.c.mustCLI("alice", "--json", "fl", "watch", id)), "\n") {
		var row fl.RoundSummary
		if json.Unmarshal([]byte(line), &row) == nil && row.Step == fl.StepTrain {
			train = append(train, row)
		}
	}
	return st, train
}

// submitSweep submits the sweep in file and returns its job ID once some
// of its shards are done: the sweep is under way.
func (f *sharedFederation) submitSweep(t testing.TB, file string) string {
	id := strings.TrimSpace(f.c.mustCLI("alice", "job", "submit", file))
	waitFor(t, "the sweep to be under way", untilRun(), func() bool { return f.c.status("alice", id).Counts.Verified > 0 })
	return id
}

// waitSweep waits until the sweep is done and checks every shard verified.
func (f *sharedFederation) waitSweep(t testing.TB, id string) jobStatus {
	return f.watchSweep(t, id)()
}

// watchSweep starts following the sweep to its end and returns the wait
// for it: the wait checks every shard verified and returns the job's
// status with its shards. It follows the job's event stream (`job watch`),
// not its status: a status poll is a process, a TLS handshake and a
// linearizable read each, load on the machine and on the Raft log the run
// shares. The watch gets 15 minutes, not cli's 4: generic shards run at
// nice 19, and beside 16 busy loops (.ci/stress) the sweep moved at 0.3
// shards/s — slow, but moving, which the watch's own output shows if it
// fails.
func (f *sharedFederation) watchSweep(t testing.TB, id string) (wait func() jobStatus) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	cmd := f.c.cliCmd(ctx, "alice", "job", "watch", id)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("job watch: %v", err)
	}
	return func() jobStatus {
		t.Helper()
		defer cancel()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("job watch: %v\n%s%s", err, out.String(), errs.String())
		}
		st := f.c.status("alice", id)
		if st.Counts.Verified != f.nShards {
			t.Fatalf("the sweep ended with %d of %d shards verified: %+v", st.Counts.Verified, f.nShards, st.Counts)
		}
		return st
	}
}

// A training run and a sweep on the same silos, through real processes:
// the README's 12-round run launched while a 120-shard sweep is under way
// both finish; every round sums all four silos at the first attempt (no
// silo was late to a round, so none sat behind generic work); no peer
// handed a lease back or let one expire (pool peers' released and expired
// counts, and the silos' hand-back series); the silos whose policy
// refuses generic shards were granted only their rounds' shards, and the two that take them ran part
// of the sweep. (Before lease kinds, the pool granted every silo the
// sweep's shards ahead of its round — a sweep submitted first comes first
// — and two of them handed each back, again and again, while the round
// waited: 0 of 12 rounds in 4 minutes.) The rates of each alone and of
// both at once are BenchmarkSharedSilos's.
func TestSilosSharedByRoundsAndSweep(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run and sweep")
	}
	f := startSharedFederation(t, sharedRounds, sharedShards)
	started := time.Now()
	sweep := f.submitSweep(t, f.writeSweep())
	run, train := f.runToEnd(t, f.writeRun(t))
	f.waitSweep(t, sweep)
	t.Logf("run %v by the leader's clock (%.2f rounds/s); sweep and run done %v after the sweep's submission",
		run.runTime(), sharedRounds/run.runTime().Seconds(), time.Since(started))

	if len(train) != sharedRounds || len(run.Models) != len(run.Jobs) {
		t.Fatalf("%d training rounds shown, %d models for %d round jobs (a step tried again); want %d rounds, one job each",
			len(train), len(run.Models), len(run.Jobs), sharedRounds)
	}
	for _, r := range train {
		if len(r.Participants) != 4 {
			t.Fatalf("round %d summed %v; every silo should be in every round", r.Round, r.Participants)
		}
	}
	recs := f.c.peers("alice")
	for peer, r := range recs {
		if r.Released != 0 || r.Expired != 0 {
			t.Errorf("%s handed %d leases back and let %d expire: %+v", peer, r.Released, r.Expired, r)
		}
	}
	for _, s := range f.rounds {
		// One lease per step's job, none of the sweep's.
		if r := recs[s]; r.Leases != len(run.Jobs) || !r.RoundsOnly {
			t.Errorf("%s (generic_shards: false) was granted %d leases for the run's %d jobs: %+v", s, r.Leases, len(run.Jobs), r)
		}
		m := scrape(t, f.metrics[s])
		if m[`scellis_silo_leases_total{kind="generic"}`] != 0 || m[`scellis_silo_leases_total{kind="round"}`] != float64(len(run.Jobs)) ||
			m["scellis_silo_leases_handed_back_total"] != 0 {
			t.Errorf("%s's lease series: generic %v, round %v, handed back %v; want 0, %d, 0", s, m[`scellis_silo_leases_total{kind="generic"}`],
				m[`scellis_silo_leases_total{kind="round"}`], m["scellis_silo_leases_handed_back_total"], len(run.Jobs))
		}
	}
	for _, s := range f.generic {
		m := scrape(t, f.metrics[s])
		if m[`scellis_silo_leases_total{kind="generic"}`] < 1 || m["scellis_silo_leases_handed_back_total"] != 0 {
			t.Errorf("%s (generic_shards: true) ran %v of the sweep's shards and handed back %v; want some, and none",
				s, m[`scellis_silo_leases_total{kind="generic"}`], m["scellis_silo_leases_handed_back_total"])
		}
	}
}

// A silo whose policy refuses generic shards (the README's
// generic_shards: false) is never granted one while a sweep waits, through
// real processes: the pool records no lease of it at all (its polls ask
// for rounds alone, and are answered without a log entry while there is
// none), and it hands nothing back. Before lease kinds it was granted the
// sweep's shards and handed each back, in a loop, for as long as the sweep
// ran.
func TestSiloWithoutGenericShardsIsNeverGrantedOne(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "own", 1, member{"hospital-a", "silo"}, member{"w1", "worker"}, member{"alice", "researcher"})
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "1", "--rows", "300", "--seed", "11", "--out", "data"))
	pp := &ports{t: t}
	metrics := pp.next()
	pp.release()
	y := readmeSilo(t, "hospital-a", 1)
	if !strings.Contains(y, "generic_shards: false") {
		t.Fatalf("the README's hospital-a.yaml no longer refuses generic shards; adapt this test:\n%s", y)
	}
	c.write("hospital-a.yaml", y+"metrics_listen: "+metrics+"\n")
	c.startAggregators()
	c.start("hospital-a", "silo", "--config", "hospital-a.yaml")
	waitFor(t, "hospital-a's /metrics", untilNoticed(), func() bool { return scrape(t, metrics) != nil })
	c.startWorker("w1")
	f := &sharedFederation{c: c, nShards: sharedShards}
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", f.writeSweep()))
	f.waitSweep(t, id)
	if r, ok := c.peers("alice")["hospital-a"]; ok && (r.Leases != 0 || r.Released != 0) {
		t.Fatalf("hospital-a (generic_shards: false) was granted %d leases and handed %d back during the sweep", r.Leases, r.Released)
	}
	m := scrape(t, metrics)
	if m[`scellis_silo_leases_total{kind="generic"}`] != 0 || m["scellis_silo_leases_handed_back_total"] != 0 {
		t.Fatalf("hospital-a's lease series: generic %v, handed back %v; want 0 and 0", m[`scellis_silo_leases_total{kind="generic"}`], m["scellis_silo_leases_handed_back_total"])
	}
	if w := c.peers("alice")["w1"]; w.Leases < sharedShards {
		t.Fatalf("the worker was granted %d leases for the sweep's %d shards", w.Leases, sharedShards)
	}
}
