package aggregator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/silo"
	"github.com/scellis/scellis/trust"
)

// One federated training round, end to end, against the same round
// computed in one process in plain Go (issue 7; overhead per round, issue
// 19).
//
// The federated figure is a fresh one-round FedAvg run per iteration,
// from launch to the run being done: the spec uploaded and the run started
// through the API (Raft), the round planned on the leader (initial model,
// bundle, secure-aggregation round opened, round job committed), four real
// silo appliances (silo.Open + Appliance.Run, as `scellis silo`, with the
// production lease pacing: a round's shard reaches them through the held
// lease request, no poll) leasing their shard, fetching bundle, spec and
// global model by hash, checking the round against their policy and
// ledger, running the client step with update-level DP (clip and noise,
// unit silo), charging their signed ledger (fsync'd), taking part in
// secure aggregation over mutual TLS on loopback, and uploading and
// reporting a signed contribution; then the unmasked sum, the server step,
// the round result stored and the run reduced and done. One aggregator
// node (real Raft on disk), all in this process, in the consortium regime
// (DP and secure aggregation mandatory).
//
// The baselines are fl.Simulate of the same strategy, parameters and data
// (each site standardised with its own statistics, as a silo does) for one
// round, with the same update-level DP and without DP, goReps times each
// per iteration, outside the benchmark timer: ns/op is the federated round
// alone. overhead-ms/round is the federated round's wall time less the
// plain-Go DP round's, both measured in this run; cpu-ms/round and
// go-dp-cpu-ms/round are the process CPU time of each (getrusage), which
// a loaded machine inflates far less than wall time; best-overhead-ms is
// the fastest federated round less the fastest plain-Go DP round, the
// rounds that found the cores free; fsync-ms is the disk's floor measured
// between the rounds (one fsync of a small append on the same file
// system) and overhead/fsync the round's overhead in those units (issue
// 19: the round's critical path holds twelve fsyncs in a row that the
// laws require, docs/fl.md).
//
// Two sizes: d=tiny, the demo's logistic model on 1,500 rows per site
// (a dozen parameters: the figure is the system's overhead), and d=1e6,
// a one-hidden-layer MLP of 10^6 parameters on 32 rows per site, one
// SGD step (the figure adds moving, masking, noising, caching and summing a
// million-element update). A third case, rounds=5, is d=tiny as a run of
// five rounds, its figures per round against five plain-Go rounds: it
// adds what a one-round run never pays, the hand-over from one round to
// the next (the round reduced, the next one planned).
//
//	go test -run '^$' -bench FLRound -benchtime 5x ./aggregator/
//	go test -run '^$' -bench 'FLRound/d=tiny' -benchtime 20x ./aggregator/
//	go test -run '^$' -bench 'FLRound/rounds=5' -benchtime 5x ./aggregator/
//
// Under -short (CI runs every benchmark once that way) only d=tiny runs:
// d=1e6 is the same round with a bigger model, rounds=5 the same rounds
// one after another (the multi-round tests cover the hand-over).

const (
	flBenchSites   = 4
	flBenchDataset = "patients"
	flBenchClip    = 1.0
	flBenchSigma   = 1.0
)

// flBenchSize is one model size of BenchmarkFLRound.
type flBenchSize struct {
	name   string
	rows   int   // per site
	params int   // 0: logistic regression; else an MLP of at least this many parameters
	epochs int64 // local epochs (0: steps)
	steps  int64 // local SGD steps, when epochs is 0
	goReps int   // baseline runs per iteration (averaged for a steadier figure)
	rounds int   // rounds a run (0: 1)
}

// runRounds is the rounds of one run of the size.
func (sz flBenchSize) runRounds() int { return max(sz.rounds, 1) }

var flBenchSizes = []flBenchSize{
	{name: "d=tiny", rows: 1500, epochs: 2, goReps: 10},
	{name: "d=1e6", rows: 32, params: 1_000_000, steps: 1, goReps: 1},
	{name: "rounds=5", rows: 1500, epochs: 2, goReps: 4, rounds: 5},
}

// model is the size's model over inputs features: an MLP's hidden width
// is the least that gives it params parameters (hidden·(inputs+2)+1).
func (sz flBenchSize) model(inputs int) fl.ModelSpec {
	if sz.params == 0 {
		return fl.ModelSpec{Kind: "logistic", Inputs: inputs}
	}
	hidden := (sz.params - 1 + inputs + 1) / (inputs + 2)
	return fl.ModelSpec{Kind: "mlp", Inputs: inputs, Hidden: hidden, Classes: 2}
}

func (sz flBenchSize) trainParams() map[string]any {
	if sz.epochs > 0 {
		return map[string]any{"lr": 0.5, "epochs": sz.epochs}
	}
	return map[string]any{"lr": 0.5, "steps": sz.steps, "batch_size": int64(sz.rows)}
}

func flBenchSpec(iter int, inputs int, sz flBenchSize) fl.RunSpec {
	return fl.RunSpec{
		Name: fmt.Sprintf("bench-%d", iter), Strategy: "fedavg", Params: sz.trainParams(),
		Model: sz.model(inputs), Dataset: flBenchDataset, Rounds: sz.runRounds(), MinCohort: 3,
		DP: true, Clip: flBenchClip, Sigma: flBenchSigma, SecureAgg: true, Seed: int64(iter), Standardize: fl.StandardizeLocal,
	}
}

func BenchmarkFLRound(b *testing.B) {
	for _, sz := range flBenchSizes {
		b.Run(sz.name, func(b *testing.B) {
			if testing.Short() && sz != flBenchSizes[0] {
				b.Skipf("-short: %s skipped (%s runs the same round)", sz.name, flBenchSizes[0].name)
			}
			benchFLRound(b, sz)
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchFLRound(b *testing.B, sz flBenchSize) {
	p, sites, silos := newFLBenchPool(b, sz.rows)
	cat := p.cat
	ctx := context.Background()
	alice := p.client("alice")

	var fed, goDP, goPlain, fedCPU, goDPCPU time.Duration
	// The fastest federated round and plain-Go DP round: on a machine
	// shared with other work, the rounds that found the cores free.
	var fedBest, goDPBest time.Duration
	best := func(b *time.Duration, d time.Duration) {
		if *b == 0 || d < *b {
			*b = d
		}
	}
	var split flBenchSplit
	floor := newFsyncFloor(b, p.dir)
	events, unsub := p.node.hub.Subscribe("")
	defer unsub()
	iter, dim := 0, 0
	for b.Loop() {
		iter++
		spec := flBenchSpec(iter, sites[0].Dims(), sz)

		start, cpu0 := time.Now(), cpuTime()
		ended, watched := split.watch(events, start)
		run, err := flBenchLaunch(ctx, alice, cat, spec)
		if err != nil {
			b.Fatal(err)
		}
		// The run's end is its RunComplete event, not the next poll of the
		// machine: a poll would add up to its period to every round.
		select {
		case <-ended:
		case <-time.After(time.Minute):
		}
		st := p.waitRun(run, time.Minute) // at once, unless events were dropped
		fed += time.Since(start)
		best(&fedBest, time.Since(start))
		fedCPU += cpuTime() - cpu0
		watched()
		if st.State != coordinator.RunDone || len(st.Models) != sz.runRounds() {
			b.Fatalf("run %d ended %+v", iter, st)
		}

		b.StopTimer()
		floor.measure(b, fsyncsPerRound)
		if iter == 1 {
			r, g := p.roundResult(st.Models[0])
			// Under DP a round sums no metrics (they would leave unnoised).
			if len(r.Participants) != flBenchSites || len(r.Metrics) != 0 {
				b.Fatalf("round: participants %v (dropped %v, absent %v), metrics %v", r.Participants, r.Dropped, r.Absent, r.Metrics)
			}
			w, _ := g.Vector("w")
			dim = len(w)
		}
		canon, _, strat, err := spec.Resolve(cat, "")
		if err != nil {
			b.Fatal(err)
		}
		strat = strat.With(canon.Params()) // the model, as the silos and the aggregator take it
		for _, c := range []struct {
			priv           fl.Privacy
			acc, cpu, best *time.Duration
		}{
			{fl.Privacy{Unit: fl.UnitSilo, Clip: flBenchClip, Sigma: flBenchSigma}, &goDP, &goDPCPU, &goDPBest},
			{fl.Privacy{}, &goPlain, nil, nil},
		} {
			for range sz.goReps {
				start, cpu0 := time.Now(), cpuTime()
				h, err := fl.Simulate(ctx, strat, sites, sz.runRounds(), fl.SimOptions{Env: script.Env{Catalog: cat}, Seed: uint64(iter), Privacy: c.priv})
				*c.acc += time.Since(start)
				if c.best != nil {
					best(c.best, time.Since(start))
				}
				if c.cpu != nil {
					*c.cpu += cpuTime() - cpu0
				}
				if err != nil {
					b.Fatal(err)
				}
				if len(h.Rounds) != sz.runRounds() || h.Rounds[0].Participants != flBenchSites {
					b.Fatalf("simulated round %+v", h.Rounds)
				}
			}
		}
		b.StartTimer()
	}

	// Every silo paid for every round it released an update in.
	for _, a := range silos {
		s, err := a.Ledger.Status(flBenchDataset)
		if err != nil {
			b.Fatal(err)
		}
		if s.Charges != iter*sz.runRounds() || s.Spent <= 0 {
			b.Fatalf("silo %s: %d ledger charges (ε = %v) after %d rounds", a.Name, s.Charges, s.Spent, iter)
		}
	}

	// Every figure is per round: a run of several rounds counts each.
	rounds := sz.runRounds()
	ms := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / 1e3 / float64(n*rounds) }
	fedMS, goDPMS, goMS := ms(fed, iter), ms(goDP, iter*sz.goReps), ms(goPlain, iter*sz.goReps)
	b.ReportMetric(float64(dim), "d")
	b.ReportMetric(fedMS, "ms/round")
	b.ReportMetric(goDPMS, "go-dp-ms/round")
	b.ReportMetric(goMS, "go-ms/round")
	b.ReportMetric(fedMS/goDPMS, "fed/go-dp")
	b.ReportMetric(fedMS/goMS, "fed/go")
	b.ReportMetric(fedMS-goDPMS, "overhead-ms/round")
	b.ReportMetric(ms(fedBest, 1)-ms(goDPBest, 1), "best-overhead-ms")
	b.ReportMetric(ms(fedCPU, iter), "cpu-ms/round")
	fsyncMS := floor.ms()
	b.ReportMetric(fsyncMS, "fsync-ms")
	b.ReportMetric((fedMS-goDPMS)/fsyncMS, "overhead/fsync")
	b.ReportMetric(ms(goDPCPU, iter*sz.goReps), "go-dp-cpu-ms/round")
	if rounds == 1 { // the split times one round's events
		split.report(b, iter)
	}
	// The secure-aggregation phases as the host timed them (silos
	// advertise before they train: mask includes their local training,
	// release cache, outbox entry and ledger charge).
	if mfs, err := p.node.metrics.reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() != "scellis_secagg_phase_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if h := m.GetHistogram(); h.GetSampleCount() > 0 {
					b.ReportMetric(1e3*h.GetSampleSum()/float64(h.GetSampleCount()), "secagg-"+m.GetLabel()[0].GetValue()+"-ms")
				}
			}
		}
	}
}

// fsyncsPerRound is how many single fsyncs the floor measures after each
// round.
const fsyncsPerRound = 8

// fsyncFloor measures the disk's floor in the same run as the rounds: the
// wall time of one fsync of a small append to a file on the file system
// the silos and the node write to (the benchmark's folder), taken between
// rounds, so that the overhead of a round can be read as a number of
// fsyncs in a row (overhead/fsync). A round's critical path holds at least
// eleven durable writes the laws require (docs/fl.md).
type fsyncFloor struct {
	f     *os.File
	total time.Duration
	n     int
}

func newFsyncFloor(b *testing.B, dir string) *fsyncFloor {
	f, err := os.OpenFile(filepath.Join(dir, "fsync-floor"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return &fsyncFloor{f: f}
}

func (ff *fsyncFloor) measure(b *testing.B, n int) {
	line := make([]byte, 100) // about a journal line or a ledger entry's size
	for range n {
		start := time.Now()
		if _, err := ff.f.Write(line); err != nil {
			b.Fatal(err)
		}
		if err := ff.f.Sync(); err != nil {
			b.Fatal(err)
		}
		ff.total += time.Since(start)
		ff.n++
	}
}

func (ff *fsyncFloor) ms() float64 {
	if ff.n == 0 {
		return 0
	}
	return float64(ff.total.Microseconds()) / 1e3 / float64(ff.n)
}

// flBenchSplit splits the federated rounds' wall time by the replicated
// events the leader published: launch to the last silo's lease (start:
// spec upload, run start, planning, bundle, round job), the last lease
// to the last verified report (silos: fetch, checks, training, DP,
// ledger, secure aggregation, upload, report), and the last report to
// the run done (reduce: unmasked sum, server step, result stored).
type flBenchSplit struct{ start, silos, reduce time.Duration }

// watch records one round's events until the returned stop is called;
// ended is closed when a run completes.
func (s *flBenchSplit) watch(events <-chan coordinator.Event, start time.Time) (ended <-chan struct{}, stop func()) {
	done, quit, end := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var leased, reported time.Time
	go func() {
		defer close(done)
		for {
			select {
			case e, ok := <-events:
				if !ok {
					// Dropped for falling behind: the caller polls instead.
					events = nil
					select {
					case <-end:
					default:
						close(end)
					}
					continue
				}
				switch e.(type) {
				case coordinator.ShardLeased:
					leased = time.Now()
				case coordinator.ShardVerified:
					reported = time.Now()
				case coordinator.RunComplete:
					select {
					case <-end:
					default:
						close(end)
					}
				}
			case <-quit:
				return
			}
		}
	}()
	return end, func() {
		now := time.Now()
		close(quit)
		<-done
		if leased.IsZero() || reported.IsZero() {
			return // events dropped: leave this round out of the split
		}
		s.start += leased.Sub(start)
		s.silos += reported.Sub(leased)
		s.reduce += now.Sub(reported)
	}
}

func (s *flBenchSplit) report(b *testing.B, rounds int) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(rounds) }
	b.ReportMetric(ms(s.start), "start-ms")
	b.ReportMetric(ms(s.silos), "silos-ms")
	b.ReportMetric(ms(s.reduce), "reduce-ms")
}

// flBenchLaunch resolves and uploads a run spec and starts the run through
// the API, as `scellis fl launch` does.
func flBenchLaunch(ctx context.Context, c *api.Client, cat *catalog.Catalog, spec fl.RunSpec) (content.Ref, error) {
	canon, id, _, err := spec.Resolve(cat, "")
	if err != nil {
		return "", err
	}
	raw, err := content.Encode(canon)
	if err != nil {
		return "", err
	}
	if ref, err := c.PutBlob(ctx, raw); err != nil || ref != id {
		return "", fmt.Errorf("uploading the run spec: %s, %v", ref, err)
	}
	resp, err := c.StartRun(ctx, api.RunRequest{Spec: id})
	if err != nil {
		return "", err
	}
	return resp.Run, nil
}

// newFLBenchPool starts a one-node aggregator in a consortium federation of
// four hospital silos and a launcher (alice), writes each hospital's
// generated data (rows per site) as its CSV, and opens and runs the four silo appliances
// until the benchmark ends. It returns the pool (a runPool, for its
// helpers), the sites' data as each silo loaded it, and the appliances.
func newFLBenchPool(b *testing.B, rows int) (*runPool, []*model.Dataset, []*silo.Appliance) {
	b.Helper()
	p := &runPool{data: map[string]*model.Dataset{}}
	gen, err := datagen.Hospitals(flBenchSites, rows, 11)
	if err != nil {
		b.Fatal(err)
	}
	paths, err := datagen.WriteSites(filepath.Join(b.TempDir(), "data"), gen)
	if err != nil {
		b.Fatal(err)
	}
	members := []testMember{{"alice", identity.Researcher}}
	for _, s := range gen {
		p.silos = append(p.silos, s.Name)
		members = append(members, testMember{s.Name, identity.Silo})
	}
	d := time.Minute // phase deadlines: only a failure waits them out
	p.testPool = startTestNode(b, trust.Consortium, members, Options{
		SecAgg:         wire.Deadlines{Advertise: d, Share: d, Mask: d, Unmask: d},
		SecAggLongPoll: time.Second, ReportGrace: d,
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var silos []*silo.Appliance
	var data []*model.Dataset
	for i, name := range p.silos {
		dir := filepath.Join(p.dir, name)
		c := &config.Silo{
			File: filepath.Join(dir, "silo.yaml"), Name: name, DataDir: filepath.Join(dir, "state"),
			Ledger: filepath.Join(dir, "state", "privacy.ledger"), LogLevel: "warn",
			Datasets: []config.Dataset{{Name: flBenchDataset, Path: paths[i], Label: gen[i].Data.Label, Class: trust.Confidential,
				Budget: config.Budget{Epsilon: 1e4, Delta: 1e-5}, Unit: fl.UnitSilo}},
			Policy: config.SiloPolicy{Strategies: config.DefaultStrategies(), MinCohort: 3},
		}
		a, err := silo.Open(c, p.ids[name], p.fed, silo.Options{})
		if err != nil {
			b.Fatalf("opening silo %s: %v", name, err)
		}
		a.RoundTimeout = time.Minute // Poll and LongPoll: the production defaults
		silos = append(silos, a)
		data = append(data, a.Data[flBenchDataset])
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil {
				b.Errorf("silo %s: %v", name, err)
			}
		}()
	}
	b.Cleanup(func() {
		cancel()
		wg.Wait()
		for _, a := range silos {
			a.Close()
		}
	})
	// Every silo's lease poll, its heartbeat, has reached the node: a run
	// launched sooner plans its round without the silos not yet heard.
	waitUntil(b, "every silo to poll", time.Minute, func() bool {
		return !slices.ContainsFunc(p.silos, func(s string) bool { return !p.node.alive(s) })
	})
	if !slices.EqualFunc(data, gen, func(d *model.Dataset, s datagen.Site) bool { return d.Rows() == s.Data.Rows() }) {
		b.Fatal("a silo did not load its site's rows")
	}
	return p, data, silos
}
