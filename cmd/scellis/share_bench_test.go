package main

import (
	"sync"
	"testing"
	"time"
)

// Training rounds and a sweep sharing silos, as TestSilosSharedByRoundsAndSweep
// runs them (the README's silos and run, 12 rounds; a 120-shard sweep;
// real processes on loopback), each alone and then both at once: the
// sweep submitted first and under way when the run is launched.
//
//	go test -run '^$' -bench SharedSilos -benchtime 2x ./cmd/scellis/
//
// Metrics: rounds/s of the run alone and together (its time by the
// leader's clock, fl status), shards/s of the sweep alone and together
// (from submission to done), and run-slowdown: the run's time together
// over its time alone (the bound: at most 1.5), and overlap: the
// share of the run's time together that the sweep was under way for (1:
// the sweep outlasted the run).
func BenchmarkSharedSilos(b *testing.B) {
	f := startSharedFederation(b)
	var runAlone, runTogether, sweepAlone, sweepTogether, overlap time.Duration
	for i := 0; i < b.N; i++ {
		st, _ := f.runToEnd(b, f.writeRun(b))
		runAlone += st.runTime()
		alone := st.runTime()

		start := time.Now()
		f.waitSweep(b, f.submitSweep(b, f.writeSweep()))
		sweepAlone += time.Since(start)

		start = time.Now()
		id := f.submitSweep(b, f.writeSweep())
		var wg sync.WaitGroup
		wg.Add(1)
		var sweepDone time.Time
		go func() {
			defer wg.Done()
			f.waitSweep(b, id)
			sweepDone = time.Now()
		}()
		st, _ = f.runToEnd(b, f.writeRun(b))
		wg.Wait()
		runTogether += st.runTime()
		sweepTogether += sweepDone.Sub(start)
		// The part of the run the sweep was under way for (one host, one
		// clock): the sweep was submitted before the run started.
		end := time.UnixMilli(st.DoneAt)
		if sweepDone.Before(end) {
			end = sweepDone
		}
		overlap += end.Sub(time.UnixMilli(st.StartedAt))
		b.Logf("run alone %v, together %v (×%.2f)", alone, st.runTime(), st.runTime().Seconds()/alone.Seconds())
	}
	rounds, shards := float64(sharedRounds*b.N), float64(120*b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rounds/runAlone.Seconds(), "alone-rounds/s")
	b.ReportMetric(rounds/runTogether.Seconds(), "together-rounds/s")
	b.ReportMetric(shards/sweepAlone.Seconds(), "alone-shards/s")
	b.ReportMetric(shards/sweepTogether.Seconds(), "together-shards/s")
	b.ReportMetric(runTogether.Seconds()/runAlone.Seconds(), "run-slowdown")
	b.ReportMetric(overlap.Seconds()/runTogether.Seconds(), "overlap")
}
