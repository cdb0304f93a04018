package fl

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

// SimOptions configures Simulate.
type SimOptions struct {
	// Env gives the calls their catalog (for load()) and limits; Simulate
	// sets Seed and Training for every call itself.
	Env script.Env
	// Seed keys every random choice of the simulation: the per-site
	// training seeds (params seed and the rng module), the cohorts, the
	// stragglers and the asynchronous latencies. Without DP, the same
	// seed gives the same History, bit for bit.
	Seed uint64
	// Cohort is the number of sites per synchronous round, drawn uniformly
	// without replacement each round; 0 means every site.
	Cohort int
	// Stragglers is the fraction of a round's cohort (rounded to the
	// nearest site) that can do only part of its local work: each gets
	// params work uniform in (0, 1) instead of 1, and the strategy decides
	// (FedAvg drops such a site, FedProx keeps its partial work). This is
	// the systems heterogeneity of Li et al. 2020. In asynchronous mode it
	// is the probability that one local run is a straggler's.
	Stragglers float64
	// Privacy is applied to every client step.
	Privacy Privacy
	// Async, when set, runs buffered asynchronous aggregation (FedBuff)
	// instead of synchronous rounds.
	Async *Async
	// Parallel bounds how many client steps of a synchronous round run at
	// once (0: GOMAXPROCS). Results are summed in site order whatever it
	// is, so it never changes the result.
	Parallel int
	// OnRound, when set, sees every round as it completes.
	OnRound func(Round)
	// ClientSeed, when set, gives the seed of site i's client step in
	// synchronous round r (its script rng and, through ClientParamSeed,
	// params.seed) in place of one derived from Seed: fl simulate passes
	// the live path's derivation (ClientSeed of the run, the coordinator
	// round and the site's name), so it trains exactly as the silos do.
	ClientSeed func(r, i int) [32]byte
	// RoundCohort, when set, gives the sites (sorted indices) of
	// synchronous round r and each one's work (nil: all full) in place of
	// Cohort and Stragglers drawn from Seed: fl simulate passes the live
	// path's RunSpec.RoundCohort (keyed by the run and the coordinator
	// round), so a simulation samples and straggles the sites a live run of
	// the same spec over the same silos would.
	RoundCohort func(r int) (cohort []int, work []float64)
}

// Async configures asynchronous simulation: every site trains
// continuously, each local run taking a simulated time drawn from the
// site's own speed (log-normal across sites, jittered per run), starting
// from the newest global version; an update that arrives after server steps
// happened meanwhile is stale by that many versions (params staleness).
// Every Buffer updates, the server step applies their sum.
type Async struct {
	// Buffer is K, the updates per server step (≥ 1; the live engine
	// secure-aggregates each buffer, so it needs K ≥ 3).
	Buffer int
}

// Round records one server step.
type Round struct {
	Index        int                // 0-based
	Participants int                // client steps that contributed an update
	Declined     int                // client steps that declined (weight 0, no update)
	Weight       float64            // total weight handed to the server step
	Metrics      map[string]float64 // summed client metrics: the incoming global on their rows
	Hash         content.Ref        // model hash of the global state after the step
	MaxStaleness int                // asynchronous mode: the stalest update in the buffer
	// Charges holds, per site index, the mechanisms its client step would
	// charge its ledger for this step (none without DP).
	Charges map[int][]dp.Mechanism
	// Start is the global state the step started from, Global the one it
	// made (decoded from its canonical encoding, as a silo sees it).
	Start, Global Global
	// Cohort is the sites (sorted indices) of a synchronous round.
	Cohort []int
}

// Mean returns Metrics[name] / Metrics["examples"], the mean of a summed
// metric (0 when no examples were counted).
func (r Round) Mean(name string) float64 {
	n := r.Metrics["examples"]
	if n == 0 {
		return 0
	}
	return r.Metrics[name] / n
}

// History is the outcome of Simulate.
type History struct {
	Rounds []Round
	Final  Global      // the last global state
	Hash   content.Ref // its model hash
	// States holds each site's client state after the run, canonically
	// encoded as a silo persists it (nil: none).
	States [][]byte
}

// Simulate runs rounds server steps of strategy s over sites, all in this
// process, the way the federation would with plain sums in place of secure
// aggregation: Init, then for each round every site of the cohort runs
// ClientStep (concurrently), their updates, weights and metrics are summed
// in site order, and ServerStep makes the next global. The global state
// travels canonically encoded (and is decoded again, as a silo fetching it
// by hash would) and client states are persisted encoded between rounds.
//
// Each client step's params are s.Params overlaid with round (the server
// step), seed (per site and round), work (1, or less for a straggler) and
// sites (len(sites)); asynchronous mode adds staleness. A round whose every
// site declines calls the server step with a zero sum and weight 0 (the
// round's cohort still sends masked zeros under secure aggregation), except
// before the first update of the run, when the length of the sum is not
// known yet and the round leaves the global state unchanged.
func Simulate(ctx context.Context, s *Strategy, sites []*model.Dataset, rounds int, opts SimOptions) (History, error) {
	if err := opts.check(sites, rounds); err != nil {
		return History{}, err
	}
	if err := opts.Privacy.Validate(); err != nil {
		return History{}, err
	}
	sim := &simulation{ctx: ctx, s: s, sites: sites, opts: opts, states: make([][]byte, len(sites))}
	env := opts.Env
	env.Seed = sim.callSeed("init", 0, 0, 0)
	g, err := Init(ctx, env, s, sites[0].Dims())
	if err != nil {
		return History{}, err
	}
	if sim.global, sim.hash, err = transfer(g); err != nil {
		return History{}, err
	}
	if opts.Async != nil {
		err = sim.runAsync(rounds)
	} else {
		err = sim.runSync(rounds)
	}
	if err != nil {
		return History{}, err
	}
	return History{Rounds: sim.rounds, Final: sim.global, Hash: sim.hash, States: sim.states}, nil
}

func (o *SimOptions) check(sites []*model.Dataset, rounds int) error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.FLBadSimulation, "fl simulate", format, args...)
	}
	switch {
	case len(sites) == 0:
		return bad("no sites to simulate")
	case rounds < 1:
		return bad("rounds is %d; simulate at least one", rounds)
	case !(o.Stragglers >= 0 && o.Stragglers <= 1):
		return bad("straggler fraction %v is outside [0, 1]", o.Stragglers)
	case o.Cohort < 0 || o.Cohort > len(sites):
		return bad("cohort of %d sites out of %d", o.Cohort, len(sites))
	case o.Async != nil && o.Async.Buffer < 1:
		return bad("asynchronous buffer of %d updates; it needs at least 1", o.Async.Buffer)
	case o.Parallel < 0:
		return bad("parallelism %d is negative", o.Parallel)
	}
	for i, d := range sites {
		if d == nil || d.Rows() == 0 {
			return bad("site %d has no rows", i)
		}
		if d.Dims() != sites[0].Dims() {
			return bad("site %d has %d features, site 0 has %d", i, d.Dims(), sites[0].Dims())
		}
	}
	return nil
}

// transfer encodes g canonically, hashes it and decodes it again: what a
// silo receives when it fetches the global by hash.
func transfer(g Global) (Global, content.Ref, error) {
	b, err := g.Encode()
	if err != nil {
		return nil, "", err
	}
	out, err := DecodeGlobal(b)
	if err != nil {
		return nil, "", err
	}
	return out, content.Hash(b), nil
}

type simulation struct {
	ctx    context.Context
	s      *Strategy
	sites  []*model.Dataset
	opts   SimOptions
	global Global
	hash   content.Ref
	states [][]byte
	rounds []Round
	dim    int // length of the updates, once known
	// roundCohort is the cohort of the synchronous round being served.
	roundCohort []int
}

// newRand returns a generator keyed by the simulation seed and a purpose.
func (sim *simulation) newRand(purpose string, a, b int) *rand.Rand {
	return rand.New(rand.NewChaCha8(sim.key(purpose, a, b, 0)))
}

func (sim *simulation) key(purpose string, a, b, c int) [32]byte {
	h := sha256.New()
	h.Write([]byte("scellis/fl/simulate/" + purpose + "\x00"))
	var buf [32]byte
	binary.LittleEndian.PutUint64(buf[0:], sim.opts.Seed)
	binary.LittleEndian.PutUint64(buf[8:], uint64(a))
	binary.LittleEndian.PutUint64(buf[16:], uint64(b))
	binary.LittleEndian.PutUint64(buf[24:], uint64(c))
	h.Write(buf[:])
	var k [32]byte
	copy(k[:], h.Sum(nil))
	return k
}

func (sim *simulation) callSeed(purpose string, a, b, c int) []byte {
	k := sim.key(purpose, a, b, c)
	return k[:]
}

// trainSeed is the params seed of one client step: 53 bits, so it is exact
// in JSON too.
func (sim *simulation) trainSeed(round, site, run int) int64 {
	k := sim.key("train-seed", round, site, run)
	return int64(binary.LittleEndian.Uint64(k[:8]) & (1<<53 - 1))
}

// step runs one client step of site i at round r from global g.
func (sim *simulation) step(g Global, r, i, run int, work float64, extra map[string]any) (ClientOutput, error) {
	params := map[string]any{
		"round": int64(r),
		"seed":  sim.trainSeed(r, i, run),
		"work":  work,
		"sites": int64(len(sim.sites)),
	}
	for k, v := range extra {
		params[k] = v
	}
	state, err := DecodeState(sim.states[i])
	if err != nil {
		return ClientOutput{}, err
	}
	env := sim.opts.Env
	env.Seed = sim.callSeed("client", r, i, run)
	if sim.opts.ClientSeed != nil && sim.opts.Async == nil {
		seed := sim.opts.ClientSeed(r, i)
		env.Seed, params["seed"] = seed[:], ClientParamSeed(seed)
	}
	return ClientStep(sim.ctx, env, sim.s.With(params), g, sim.sites[i], state, sim.opts.Privacy)
}

// accumulator sums one server step's contributions in a fixed order.
type accumulator struct {
	charges map[int][]dp.Mechanism
	sum     []float64
	weight  float64
	metrics map[string]float64
	part    int
	decl    int
	stale   int
}

func (sim *simulation) add(acc *accumulator, site int, out ClientOutput) error {
	if out.Update == nil {
		acc.decl++
	} else {
		if sim.dim == 0 {
			sim.dim = len(out.Update)
		}
		if len(out.Update) != sim.dim {
			return diag.New(diag.FLDimension, sim.s.Subject(), "site %d returned an update of %d values, earlier updates had %d", site, len(out.Update), sim.dim).
				WithHelp("every site must return updates of one length: the same model shape and strategy parameters everywhere")
		}
		if acc.sum == nil {
			acc.sum = make([]float64, sim.dim)
		}
		for j, v := range out.Update {
			acc.sum[j] += v
		}
		acc.part++
	}
	acc.weight += out.Weight
	if len(out.Mechanism.Mechanisms) > 0 {
		if acc.charges == nil {
			acc.charges = map[int][]dp.Mechanism{}
		}
		acc.charges[site] = append(acc.charges[site], out.Mechanism.Mechanisms...)
	}
	if acc.metrics == nil {
		acc.metrics = map[string]float64{}
	}
	keys := make([]string, 0, len(out.Metrics))
	for k := range out.Metrics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		acc.metrics[k] += out.Metrics[k]
	}
	b, err := EncodeState(out.State)
	if err != nil {
		return err
	}
	if out.State == nil {
		b = nil
	}
	sim.states[site] = b
	return nil
}

// serve runs the server step on an accumulated buffer and records it.
func (sim *simulation) serve(acc *accumulator) error {
	idx := len(sim.rounds)
	start := sim.global
	sum := acc.sum
	if sum == nil && sim.dim > 0 {
		sum = make([]float64, sim.dim)
	}
	if sum != nil {
		env := sim.opts.Env
		env.Seed = sim.callSeed("server", idx, 0, 0)
		g, err := ServerStep(sim.ctx, env, sim.s.With(map[string]any{"round": int64(idx), "sites": int64(len(sim.sites))}), sim.global, sum, acc.weight)
		if err != nil {
			return err
		}
		if sim.global, sim.hash, err = transfer(g); err != nil {
			return err
		}
	}
	r := Round{Index: idx, Participants: acc.part, Declined: acc.decl, Weight: acc.weight,
		Metrics: acc.metrics, Hash: sim.hash, MaxStaleness: acc.stale, Start: start, Global: sim.global, Charges: acc.charges,
		Cohort: sim.roundCohort}
	sim.rounds = append(sim.rounds, r)
	if sim.opts.OnRound != nil {
		sim.opts.OnRound(r)
	}
	return nil
}

func (sim *simulation) runSync(rounds int) error {
	n := len(sim.sites)
	par := sim.opts.Parallel
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}
	for r := range rounds {
		if err := sim.ctx.Err(); err != nil {
			return err
		}
		var cohort []int
		var work []float64
		if sim.opts.RoundCohort != nil {
			cohort, work = sim.opts.RoundCohort(r)
			if work == nil {
				work = make([]float64, len(cohort))
				for j := range work {
					work[j] = 1
				}
			}
			if len(work) != len(cohort) {
				return fmt.Errorf("round %d: %d work fractions for a cohort of %d", r, len(work), len(cohort))
			}
		} else {
			cohort = sim.cohort(r, n)
			work = sim.stragglerWork(r, cohort)
		}
		sim.roundCohort = cohort
		outs := make([]ClientOutput, len(cohort))
		errs := make([]error, len(cohort))
		var wg sync.WaitGroup
		sem := make(chan struct{}, par)
		g := sim.global
		for j, i := range cohort {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				outs[j], errs[j] = sim.step(g, r, i, 0, work[j], nil)
			}()
		}
		wg.Wait()
		var acc accumulator
		for j, i := range cohort {
			if errs[j] != nil {
				return fmt.Errorf("round %d, site %d: %w", r, i, errs[j])
			}
			if err := sim.add(&acc, i, outs[j]); err != nil {
				return err
			}
		}
		if err := sim.serve(&acc); err != nil {
			return err
		}
	}
	return nil
}

// cohort returns the sorted site indices of round r.
func (sim *simulation) cohort(r, n int) []int {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	k := sim.opts.Cohort
	if k == 0 || k == n {
		return all
	}
	rng := sim.newRand("cohort", r, 0)
	for i := n - 1; i > 0; i-- { // Fisher–Yates on Uint64N only, stable across Go releases
		j := int(rng.Uint64N(uint64(i + 1)))
		all[i], all[j] = all[j], all[i]
	}
	out := all[:k]
	sort.Ints(out)
	return out
}

// stragglerWork returns the work fraction of each cohort member.
func (sim *simulation) stragglerWork(r int, cohort []int) []float64 {
	work := make([]float64, len(cohort))
	for j := range work {
		work[j] = 1
	}
	k := int(math.Round(sim.opts.Stragglers * float64(len(cohort))))
	if k == 0 {
		return work
	}
	rng := sim.newRand("stragglers", r, 0)
	order := make([]int, len(cohort))
	for i := range order {
		order[i] = i
	}
	for i := len(order) - 1; i > 0; i-- {
		j := int(rng.Uint64N(uint64(i + 1)))
		order[i], order[j] = order[j], order[i]
	}
	for _, j := range order[:k] {
		work[j] = partialWork(rng)
	}
	return work
}

// partialWork is uniform in (0, 1).
func partialWork(rng *rand.Rand) float64 {
	return (float64(rng.Uint64()>>11) + 0.5) * 0x1p-53
}

// asyncRun is one site's local run in asynchronous mode.
type asyncRun struct {
	site    int
	seq     int     // the site's run number
	version int     // the global version it trains from
	finish  float64 // simulated time it reports
	work    float64
}

func (sim *simulation) runAsync(rounds int) error {
	n := len(sim.sites)
	speed := make([]float64, n)
	sr := sim.newRand("speed", 0, 0)
	for i := range speed {
		speed[i] = math.Exp(0.5 * sr.NormFloat64())
	}
	start := func(site, seq, version int, now float64) asyncRun {
		rng := sim.newRand("run", site, seq)
		work := 1.0
		if rng.Float64() < sim.opts.Stragglers {
			work = partialWork(rng)
		}
		return asyncRun{site: site, seq: seq, version: version, work: work,
			finish: now + speed[site]*(0.5+rng.Float64())}
	}
	versions := map[int]Global{0: sim.global}
	running := make([]asyncRun, n)
	for i := range running {
		running[i] = start(i, 0, 0, 0)
	}
	var acc accumulator
	version := 0
	for version < rounds {
		if err := sim.ctx.Err(); err != nil {
			return err
		}
		next := 0 // the run that reports first; ties go to the lowest site
		for i, r := range running {
			if r.finish < running[next].finish {
				next = i
			}
		}
		run := running[next]
		tau := version - run.version
		out, err := sim.step(versions[run.version], version, run.site, run.seq, run.work,
			map[string]any{"staleness": int64(tau)})
		if err != nil {
			return fmt.Errorf("version %d, site %d: %w", version, run.site, err)
		}
		if err := sim.add(&acc, run.site, out); err != nil {
			return err
		}
		if out.Update != nil {
			acc.stale = max(acc.stale, tau)
		}
		if acc.part >= sim.opts.Async.Buffer {
			if err := sim.serve(&acc); err != nil {
				return err
			}
			acc = accumulator{}
			version++
			versions[version] = sim.global
		}
		// The site fetches the newest global and starts its next run.
		running[next] = start(run.site, run.seq+1, version, run.finish)
		// Forget versions no run trains from any more.
		for v := range versions {
			used := v == version
			for _, r := range running {
				used = used || r.version == v
			}
			if !used {
				delete(versions, v)
			}
		}
	}
	return nil
}
