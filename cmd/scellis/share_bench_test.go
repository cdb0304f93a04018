package main

import (
	"testing"
	"time"
)

// A training run alone and the same run on silos a sweep is using, as
// TestSilosSharedByRoundsAndSweep runs them (the README's silos and run,
// 12 rounds; a 120-shard sweep; real processes on loopback), in one
// benchmark: each iteration times the run alone and the run launched while
// a sweep is under way, the two in alternating order (alone first on even
// iterations, with the sweep first on odd ones) so that the machine's load
// drifting over the benchmark weighs on both alike.
//
//	go test -run '^$' -bench SharedSilos -benchtime 6x ./cmd/scellis/
//
// Metrics, each run's time by the leader's replicated clock (fl status's
// started_at and done_at):
//   - run-slowdown: the run's time with the sweep over its time alone (the
//     issue's bound: at most 1.5);
//   - alone-rounds/s and together-rounds/s: the run's rate alone and with
//     the sweep;
//   - sweep-shards/s: the sweep's shards decided while the run went (by
//     each shard's decided_at), over the run's time; whole-sweep-shards/s:
//     the sweep's from its submission to its end;
//   - overlap: the share of the run's time the sweep was still under way
//     for (1: the sweep outlasted every run, as it should for the figures
//     above to mean "with the sweep");
//   - handed-back/op and expired/op: leases given back or left to expire,
//     every peer's (pool peers' released and expired counts): lease churn,
//     0 when silos lease only what they run.
//
// Under -short (CI runs every benchmark once that way) the run has 3
// rounds and the sweep 24 shards: the same processes and commands.
func BenchmarkSharedSilos(b *testing.B) {
	rounds, shards := sharedRounds, sharedShards
	if testing.Short() {
		rounds, shards = 3, 24
	}
	f := startSharedFederation(b, rounds, shards)
	before := f.c.peers("alice")
	var alone, together, sweepTime, overlap time.Duration
	var decided, swept int
	for i := 0; i < b.N; i++ {
		var a time.Duration
		if i%2 == 0 {
			a = f.runAlone(b)
		}
		w := f.runWithSweep(b)
		if i%2 == 1 {
			a = f.runAlone(b)
		}
		alone += a
		together += w.run
		decided += w.decided
		swept += shards
		sweepTime += w.sweep
		overlap += w.overlap
		b.Logf("run alone %v, with the sweep %v (×%.2f); %d shards decided during it, sweep %v in all",
			a, w.run, w.run.Seconds()/a.Seconds(), w.decided, w.sweep)
	}
	after := f.c.peers("alice")
	var released, expired int
	for peer, r := range after {
		released += r.Released - before[peer].Released
		expired += r.Expired - before[peer].Expired
	}
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(together.Seconds()/alone.Seconds(), "run-slowdown")
	b.ReportMetric(float64(rounds)*n/alone.Seconds(), "alone-rounds/s")
	b.ReportMetric(float64(rounds)*n/together.Seconds(), "together-rounds/s")
	b.ReportMetric(float64(decided)/together.Seconds(), "sweep-shards/s")
	b.ReportMetric(float64(swept)/sweepTime.Seconds(), "whole-sweep-shards/s")
	b.ReportMetric(overlap.Seconds()/together.Seconds(), "overlap")
	b.ReportMetric(float64(released)/n, "handed-back/op")
	b.ReportMetric(float64(expired)/n, "expired/op")
}

// runAlone runs the training run to its end with nothing else on the pool
// and returns its time by the leader's clock.
func (f *sharedFederation) runAlone(b *testing.B) time.Duration {
	st, _ := f.runToEnd(b, f.writeRun(b))
	return st.runTime()
}

// withSweep is one training run on silos a sweep is using.
type withSweep struct {
	run     time.Duration // the run's time
	decided int           // the sweep's shards decided during it
	sweep   time.Duration // the sweep's, submission to end
	overlap time.Duration // of the run's time, how long the sweep was under way
}

// runWithSweep submits a sweep, launches the training run once the sweep
// is under way, and waits for both to end. All times are the leader's
// replicated clock's: the run's started_at and done_at, the sweep's
// submitted_at and done_at, each shard's decided_at.
func (f *sharedFederation) runWithSweep(b *testing.B) withSweep {
	wait := f.watchSweep(b, f.submitSweep(b, f.writeSweep()))
	run, _ := f.runToEnd(b, f.writeRun(b))
	sweep := wait()
	var w withSweep
	w.run = run.runTime()
	w.sweep = time.Duration(sweep.DoneAt-sweep.SubmittedAt) * time.Millisecond
	var last int64
	for _, s := range sweep.Shards {
		if s.DecidedAt >= run.StartedAt && s.DecidedAt <= run.DoneAt {
			w.decided++
		}
		last = max(last, s.DecidedAt)
	}
	// The sweep was under way when the run was launched (submitSweep waits
	// for a first shard); it ended with its last shard decided.
	w.overlap = time.Duration(min(last, run.DoneAt)-run.StartedAt) * time.Millisecond
	return w
}
