package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/testfault"
)

// Federated rounds as a user runs them, against the same rounds in plain
// Go, in one run. The federation is the layout `scellis federation init
// --aggregators 3 --silos N` writes (three aggregators: real Raft on disk,
// mutual TLS on loopback; N silo processes, each with its own hospital's
// rows), a FedAvg run of a logistic model with update-level DP (clip and
// noise, signed ledger charges fsync'd before release) and secure
// aggregation, launched with `scellis fl launch`. A round's time is the
// run's time by the leader's replicated clock (started_at to done_at in
// `fl status`) over its rounds, so neither CLI start-up nor watching is in
// it. The baseline is `fl simulate`'s engine (flSim: the same strategy,
// data preparation, per-site seeds and DP mechanisms over in-process
// sites, plain sums in place of secure aggregation) on the same CSVs, in
// this process.
//
//	go test -run '^$' -bench FLRoundProcesses -benchtime 2x ./cmd/scellis/
//
// Metrics: round-ms, go-round-ms and overhead-ms (their difference), per
// round; growth (silos=30 only: its round over the silos=10 round in the
// same run).
//
// Under -short (CI runs every benchmark once that way) only silos=4 runs:
// the larger federations start more of the same processes.
func BenchmarkFLRoundProcesses(b *testing.B) {
	const rounds = 5
	var tenRound float64
	for _, n := range []int{4, 10, 30} {
		b.Run(fmt.Sprintf("silos=%d", n), func(b *testing.B) {
			if testing.Short() && n > 4 {
				b.Skipf("-short: silos=%d skipped (silos=4 runs the same processes)", n)
			}
			f := startFLBenchFederation(b, n)
			var fed, plain time.Duration
			for i := 0; i < b.N; i++ {
				f.runs++
				spec := f.writeSpec(rounds)
				fed += f.runOne(b, spec, rounds)
				plain += f.simulate(b, spec)
			}
			per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(b.N*rounds) }
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(per(fed), "round-ms")
			b.ReportMetric(per(plain), "go-round-ms")
			b.ReportMetric(per(fed)-per(plain), "overhead-ms")
			switch n {
			case 10:
				tenRound = per(fed)
			case 30:
				if tenRound > 0 {
					b.ReportMetric(per(fed)/tenRound, "growth-vs-10")
				}
			}
		})
	}
}

// BenchmarkFLRoundCrossCheck is what the cross-checked reduction adds to
// a round (docs/fl.md, "The cross-checked reduction"): two federations
// of BenchmarkFLRoundProcesses' silos=4 layout, side by side in this
// run, one whose aggregators lead their rounds as before the check
// (testfault.NoCrossCheck: no transcript, no peer's recomputation), the
// other cross-checking every round; each iteration runs the same spec on
// both, in turns (the first alternating).
//
//	go test -run '^$' -bench FLRoundCrossCheck -benchtime 3x ./cmd/scellis/
//
// Metrics: the median round-ms of each (by the leader's replicated clock)
// and checked/unchecked, the median of the iterations' ratios. Under
// -short the runs are of two rounds.
func BenchmarkFLRoundCrossCheck(b *testing.B) {
	rounds := 5
	if testing.Short() {
		rounds = 2 // two federations start either way: keep CI's one pass short
	}
	plain := startFLBenchFederationEnv(b, 4, []string{testfault.Env + "=" + testfault.NoCrossCheck})
	checked := startFLBenchFederation(b, 4)
	var tPlain, tChecked []float64 // ms a round, per iteration
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(rounds) }
	for i := 0; i < b.N; i++ {
		// In turns, and each first every other iteration: neither
		// federation always runs right after the other's run.
		order := []*flBenchFederation{plain, checked}
		if i%2 == 1 {
			order[0], order[1] = checked, plain
		}
		for _, f := range order {
			f.runs++
			d := ms(f.runOne(b, f.writeSpec(rounds), rounds))
			if f == plain {
				tPlain = append(tPlain, d)
			} else {
				tChecked = append(tChecked, d)
			}
		}
	}
	// Medians, and the median of each iteration's pair's ratio: on a
	// machine shared with other work a burst of load lands on one run of
	// a pair, and a mean would carry it.
	ratios := make([]float64, len(tPlain))
	for i := range tPlain {
		ratios[i] = tChecked[i] / tPlain[i]
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(median(tPlain), "unchecked-round-ms")
	b.ReportMetric(median(tChecked), "checked-round-ms")
	b.ReportMetric(median(ratios), "checked/unchecked")
}

// median is the middle value of xs (the mean of the two middle ones).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type flBenchFederation struct {
	c    *cluster
	data string // the sites' CSVs, one per silo, named after it
	runs int
}

func startFLBenchFederation(b testing.TB, silos int) *flBenchFederation {
	return startFLBenchFederationEnv(b, silos, nil)
}

// startFLBenchFederationEnv starts the federation with aggEnv added to
// its aggregators' environment.
func startFLBenchFederationEnv(b testing.TB, silos int, aggEnv []string) *flBenchFederation {
	dir := b.TempDir()
	port := consecutivePorts(b, 6)
	mustRun(b, scellisCmd(b, dir, "federation", "init", "--dir", dir, "--aggregators", "3", "--silos", strconv.Itoa(silos),
		"--researcher", "alice", "--regime", "consortium", "--port", strconv.Itoa(port)))
	mustRun(b, scellisCmd(b, dir, "datagen", "hospitals", "--sites", strconv.Itoa(silos), "--rows", "1500", "--out", "gen"))
	data := filepath.Join(dir, "sites")
	if err := os.MkdirAll(data, 0o755); err != nil {
		b.Fatal(err)
	}
	c := &cluster{t: b, dir: dir, aggs: []string{"agg-1", "agg-2", "agg-3"}, procs: map[string]*exec.Cmd{}, exits: map[string]chan struct{}{}, env: map[string][]string{}}
	for _, a := range c.aggs {
		c.env[a] = aggEnv
	}
	b.Cleanup(c.stopAll)
	gen, err := filepath.Glob(filepath.Join(dir, "gen", "hospital-*.csv")) // sorted; numbered with zeros to sort
	if err != nil || len(gen) != silos {
		b.Fatalf("datagen wrote %d sites, want %d (%v)", len(gen), silos, err)
	}
	for i := 1; i <= silos; i++ {
		name := fmt.Sprintf("silo-%d", i)
		csv, err := os.ReadFile(gen[i-1])
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range []string{filepath.Join(dir, name, "patients.csv"), filepath.Join(data, name+".csv")} {
			if err := os.WriteFile(p, csv, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		// The written config with update-level DP (a silo is the unit) and
		// a budget for many runs.
		c.write(filepath.Join(name, "silo.yaml"), fmt.Sprintf(`name: %s
identity: identity.key
federation: federation.yaml
data_dir: data
datasets:
  - name: patients
    path: patients.csv
    label: outcome
    class: confidential
    budget: {epsilon: 100000, delta: 1.0e-5}
    unit: silo
policy:
  strategies: [fedavg]
  min_cohort: 3
`, name))
	}
	for _, a := range c.aggs {
		c.start(a, "aggregator", "--config", a+"/aggregator.yaml")
	}
	c.waitLeader()
	for i := 1; i <= silos; i++ {
		name := fmt.Sprintf("silo-%d", i)
		c.start(name, "silo", "--config", name+"/silo.yaml")
	}
	return &flBenchFederation{c: c, data: data}
}

// writeSpec writes the run spec of the next run (its seed makes it new).
func (f *flBenchFederation) writeSpec(rounds int) string {
	name := fmt.Sprintf("run-%d.yaml", f.runs)
	f.c.write(name, fmt.Sprintf(`name: bench-%d
strategy: {use: fedavg, params: {lr: 0.5, epochs: 2}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
rounds: %d
privacy: {clip: 1.0, sigma: 1.0}
standardize: local
secure_aggregation: true
seed: %d
`, f.runs, rounds, f.runs))
	return filepath.Join(f.c.dir, name)
}

// simulate times the spec's run over the same sites in this process.
func (f *flBenchFederation) simulate(b *testing.B, spec string) time.Duration {
	ctx := context.Background()
	s, err := fl.LoadRunSpec(spec)
	if err != nil {
		b.Fatal(err)
	}
	cat, err := openCatalog()
	if err != nil {
		b.Fatal(err)
	}
	sim := &flSim{unit: fl.UnitSilo, out: io.Discard}
	if err := sim.load(s, cat, spec, f.data, "", "outcome"); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := sim.run(ctx); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
