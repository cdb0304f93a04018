package spot

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The cheater simulation: a stream of shards run by a pool where some
// peers cheat, decided by the same functions the coordinator calls
// (ShouldAudit, PickAuditor, Decide, Observe, RecheckWindow, PickCanaries,
// CanaryVerdict). What the pool's environment does — which peer asks for
// work first, what a cheater answers — is simulated with a seeded
// generator; the seeds the leader would draw from crypto/rand come from
// the same generator, so a run is reproducible.
//
// Strategies:
//   - always: lies on every shard (a fresh wrong result each time);
//   - rare: once trusted, lies on 1% of its shards, honest otherwise;
//   - lazy: returns zeros without computing: every lazy peer returns the
//     same wrong result, so two lazy peers agree with each other;
//   - collude: pairs; as a trusted shard's first executor lies on 10%,
//     and as the auditor of its partner's shard copies the partner's
//     answer (they talk out of band); honest otherwise;
//   - copy: does not compute; reports the most recent accepted result it
//     can see (commit–reveal leaves no undecided result to copy), so
//     copiers agree with each other.

type strategy string

const (
	honest  strategy = "honest"
	always  strategy = "always"
	rare    strategy = "rare"
	lazy    strategy = "lazy"
	collude strategy = "collude"
	copier  strategy = "copy"
)

const (
	rareQ    = 0.01
	colludeQ = 0.10
)

type simPeer struct {
	name    string
	strat   strategy
	partner int // colluders: the other of the pair
	rec     Record
	// accepted: shards whose accepted result this peer agreed with.
	accepted []Accepted[int]
	sweptAt  int64 // its last re-check covered results accepted up to here
}

type simShard struct {
	results  []string // reports, in order
	peers    []int
	accepted string // "" until decided
	agreeing []int
	canary   bool
	audited  bool
	at       int64 // when accepted
}

type sim struct {
	t      testing.TB
	p      Params
	rng    *rand.Rand
	peers  []*simPeer
	shards []*simShard
	now    int64
	last   string // most recent accepted result (what a copier copies)
	execs  int64  // executions, the planner's canary answers included
	rareQ  float64
	// stats
	lies, liesCaughtDirect         map[strategy]int
	trustedLies, trustedLiesCaught map[strategy]int
	replaced, rechecks, reversals  int
	firstCatch                     map[int]int // peer → lies told before it was first caught
	liesTold                       map[int]int
	sinceCatch                     map[int]int        // peer → trusted lies since its last catch
	runs                           map[strategy][]int // trusted lies told up to and including each catch
}

func truth(i int) string { return fmt.Sprintf("ok:%d", i) }

func newSim(t testing.TB, seed uint64, nPeers int, frac float64, p Params) *sim {
	s := &sim{t: t, p: p, rareQ: rareQ, rng: rand.New(rand.NewPCG(seed, seed^0x5ce11)),
		lies: map[strategy]int{}, liesCaughtDirect: map[strategy]int{},
		trustedLies: map[strategy]int{}, trustedLiesCaught: map[strategy]int{},
		firstCatch: map[int]int{}, liesTold: map[int]int{}, sinceCatch: map[int]int{}, runs: map[strategy][]int{}}
	cheaters := int(math.Round(frac * float64(nPeers)))
	order := []strategy{always, rare, lazy, collude, collude, copier, rare, lazy, collude, collude}
	for i := range nPeers {
		sp := &simPeer{name: fmt.Sprintf("p%03d", i), strat: honest, partner: -1}
		if i < cheaters {
			sp.strat = order[i%len(order)]
		}
		s.peers = append(s.peers, sp)
	}
	// Pair the colluders in order.
	var open = -1
	for i, sp := range s.peers {
		if sp.strat != collude {
			continue
		}
		if open < 0 {
			open = i
			continue
		}
		sp.partner, s.peers[open].partner = open, i
		open = -1
	}
	if open >= 0 {
		s.peers[open].strat = rare // an odd colluder out lies alone
	}
	return s
}

func (s *sim) seed() []byte {
	b := make([]byte, SeedBytes)
	for i := range b {
		b[i] = byte(s.rng.Uint32())
	}
	return b
}

func (s *sim) active(except []int) []string {
	var out []string
	for i, sp := range s.peers {
		if !sp.rec.Excluded && !slices.Contains(except, i) {
			out = append(out, sp.name)
		}
	}
	return out
}

func (s *sim) index(name string) int {
	var i int
	fmt.Sscanf(name, "p%03d", &i)
	return i
}

// answer is what peer k reports for shard i, given the reports before it
// (an accomplice copies its partner's).
func (s *sim) answer(k, i int, sh *simShard, first bool) string {
	sp := s.peers[k]
	lie := func(v string) string {
		s.liesTold[k]++
		return v
	}
	switch sp.strat {
	case always:
		return lie(fmt.Sprintf("lie:%d:%d", i, k))
	case rare:
		// Lies only once trusted: a peer knows its own record.
		if sp.rec.Trusted(s.p) && s.rng.Float64() < s.rareQ {
			return lie(fmt.Sprintf("lie:%d:%d", i, k))
		}
	case lazy:
		return lie(fmt.Sprintf("zero:%d", i))
	case collude:
		if first {
			if sp.rec.Trusted(s.p) && s.rng.Float64() < colludeQ {
				return lie(fmt.Sprintf("col:%d:%d", i, min(k, sp.partner)))
			}
			break
		}
		for j, p := range sh.peers {
			if p == sp.partner && sh.results[j] != truth(i) {
				return lie(sh.results[j])
			}
		}
	case copier:
		if s.last != "" {
			return lie(s.last)
		}
		return lie("copy:nothing")
	}
	return truth(i)
}

func (s *sim) exec(k, i int, sh *simShard) {
	s.execs++
	r := s.answer(k, i, sh, len(sh.peers) == 0)
	sh.results = append(sh.results, r)
	sh.peers = append(sh.peers, k)
}

// verdict records a check's verdict on peer k and follows its action.
func (s *sim) verdict(k int, v Verdict, queue *[]int) {
	sp := s.peers[k]
	if v != Valid {
		if _, seen := s.firstCatch[k]; !seen {
			s.firstCatch[k] = s.liesTold[k]
		}
		if n := s.sinceCatch[k]; n > 0 {
			s.runs[sp.strat] = append(s.runs[sp.strat], n)
			s.sinceCatch[k] = 0
		}
	}
	a := Observe(&sp.rec, v, s.p)
	if a.Recheck {
		for _, acc := range RecheckWindow(sp.accepted, sp.sweptAt, s.p.Window) {
			*queue = append(*queue, acc.Key)
		}
		sp.sweptAt = s.now
	}
}

// run executes shard i until it is decided: first executor, the audit draw
// after its result is committed, auditors until the quorum rule decides.
func (s *sim) run(i int, sh *simShard, queue *[]int) {
	primaries := s.active(nil)
	if len(primaries) == 0 {
		s.t.Fatal("every peer is excluded")
	}
	k := s.index(primaries[s.rng.IntN(len(primaries))])
	trustedBefore := s.peers[k].rec.Trusted(s.p)
	liesBefore := s.liesTold[k]
	s.exec(k, i, sh)
	lied := s.liesTold[k] > liesBefore
	if lied {
		s.lies[s.peers[k].strat]++
		if trustedBefore {
			s.trustedLies[s.peers[k].strat]++
			s.sinceCatch[k]++
		}
	}
	seed := s.seed() // drawn after the commitment
	sh.audited = ShouldAudit(s.peers[k].rec, s.p, seed)
	s.decide(i, sh, seed, queue)
	if lied && sh.accepted != sh.results[0] {
		s.liesCaughtDirect[s.peers[k].strat]++
		if trustedBefore {
			s.trustedLiesCaught[s.peers[k].strat]++
		}
	}
}

// decide adds auditors until the shard is decided, then judges its peers.
func (s *sim) decide(i int, sh *simShard, seed []byte, queue *[]int) {
	replicas := 1
	if sh.audited {
		replicas = 2
	}
	for {
		if sh.canary {
			// The known answer decides; a report that differs is caught.
			// An auditor drawn for it runs anyway (it was leased before the
			// primary's reveal).
			if slices.Contains(sh.results, truth(i)) && (!sh.audited || len(sh.results) >= 2) {
				break
			}
		} else if d, _ := Decide(sh.results, replicas, 64); d == Verified {
			break
		}
		cands := s.active(sh.peers)
		if len(cands) == 0 {
			s.t.Fatal("no auditor left")
		}
		a := s.index(PickAuditor(cands, seed))
		s.exec(a, i, sh)
		seed = s.seed()
	}
	var canon string
	if sh.canary {
		canon = truth(i)
	} else {
		canon, _ = Majority(sh.results, replicas)
	}
	s.accept(i, sh, canon, queue)
	checked := len(sh.results) > 1 || sh.canary
	for j, k := range sh.peers {
		switch {
		case sh.results[j] == canon && checked:
			s.verdict(k, Valid, queue)
		case sh.results[j] != canon && j > 0 && sh.results[j] == sh.results[0]:
			s.verdict(k, Stamp, queue)
		case sh.results[j] != canon:
			s.verdict(k, Invalid, queue)
		}
	}
}

func (s *sim) accept(i int, sh *simShard, canon string, queue *[]int) {
	s.now++
	if sh.accepted != "" && sh.accepted != canon {
		s.replaced++
		s.reversals++
	}
	sh.accepted, sh.at = canon, s.now
	sh.agreeing = sh.agreeing[:0]
	for j, k := range sh.peers {
		if sh.results[j] == canon && !slices.Contains(sh.agreeing, k) {
			sh.agreeing = append(sh.agreeing, k)
			sp := s.peers[k]
			sp.accepted = slices.DeleteFunc(sp.accepted, func(a Accepted[int]) bool { return a.Key == i })
			sp.accepted = append(sp.accepted, Accepted[int]{Key: i, At: s.now})
			if len(sp.accepted) > 2*s.p.Window {
				sp.accepted = slices.Clone(sp.accepted[len(sp.accepted)-s.p.Window:])
			}
		}
	}
	s.last = canon
}

// recheck re-executes an accepted shard on random auditors until their
// fresh reports alone decide (Decide with 2 replicas, as the coordinator's
// re-check does): the accepted result is kept or replaced.
func (s *sim) recheck(i int, queue *[]int) {
	sh := s.shards[i]
	if sh.canary {
		return
	}
	s.rechecks++
	prior, before := sh.accepted, len(sh.results)
	priorAgreeing := slices.Clone(sh.agreeing)
	seed := s.seed()
	var canon string
	for {
		d, h := Decide(sh.results[before:], 2, 64)
		if d == Verified {
			canon = h
			break
		}
		cands := s.active(sh.peers)
		if len(cands) == 0 {
			return
		}
		s.exec(s.index(PickAuditor(cands, seed)), i, sh)
		seed = s.seed()
	}
	if canon != prior {
		for _, k := range priorAgreeing {
			sp := s.peers[k]
			sp.accepted = slices.DeleteFunc(sp.accepted, func(a Accepted[int]) bool { return a.Key == i })
			s.verdict(k, Invalid, queue)
		}
	}
	s.accept(i, sh, canon, queue)
	for j := before; j < len(sh.results); j++ {
		k := sh.peers[j]
		switch {
		case sh.results[j] == canon:
			s.verdict(k, Valid, queue)
		case sh.results[j] == prior:
			s.verdict(k, Stamp, queue)
		default:
			s.verdict(k, Invalid, queue)
		}
	}
}

type simReport struct {
	frac                 float64
	shards               int
	wrong                map[strategy]int
	overhead, steady     float64
	excluded             map[strategy]int
	cheaters             map[strategy]int
	honestExcluded       int
	replaced, rechecks   int
	lies, caught         map[strategy]int
	trustedLies, tCaught map[strategy]int
	firstCatch           map[strategy][]int
	// wrongFromCaught counts wrong accepted results vouched for by a peer
	// that was caught after accepting them: its re-check window should
	// have replaced them.
	wrongFromCaught int
}

func (s *sim) runAll(n int, canaryRate float64) simReport {
	s.shards = make([]*simShard, n)
	canaries := map[int]bool{}
	for _, c := range PickCanaries(n, CanaryCount(n, canaryRate), s.seed()) {
		canaries[c] = true
	}
	var half int64
	for i := range n {
		if i == n/2 {
			half = s.execs
		}
		sh := &simShard{canary: canaries[i]}
		if sh.canary {
			s.execs++ // the planner computed its answer
		}
		s.shards[i] = sh
		var queue []int
		s.run(i, sh, &queue)
		queued := map[int]bool{i: true}
		for len(queue) > 0 {
			j := queue[0]
			queue = queue[1:]
			if !queued[j] {
				queued[j] = true
				s.recheck(j, &queue)
			}
		}
	}
	r := simReport{shards: n, wrong: map[strategy]int{}, excluded: map[strategy]int{}, cheaters: map[strategy]int{},
		replaced: s.replaced, rechecks: s.rechecks, lies: s.lies, caught: s.liesCaughtDirect,
		trustedLies: s.trustedLies, tCaught: s.trustedLiesCaught, firstCatch: map[strategy][]int{}}
	for i, sh := range s.shards {
		if sh.accepted != truth(i) {
			r.wrong[s.peers[sh.peers[0]].strat]++
			for _, k := range sh.agreeing {
				if s.peers[k].rec.Failed > 0 && s.peers[k].sweptAt >= sh.at {
					r.wrongFromCaught++
				}
			}
		}
	}
	for k, sp := range s.peers {
		r.cheaters[sp.strat]++
		if sp.rec.Excluded {
			if sp.strat == honest {
				r.honestExcluded++
			}
			r.excluded[sp.strat]++
		}
		if c, ok := s.firstCatch[k]; ok && sp.strat != honest {
			r.firstCatch[sp.strat] = append(r.firstCatch[sp.strat], c)
		}
	}
	r.overhead = float64(s.execs) / float64(n)
	r.steady = float64(s.execs-half) / float64(n-n/2)
	return r
}

func TestCheaterSimulation(t *testing.T) {
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 20_000
	}
	const peers = 50
	p := DefaultParams
	for _, frac := range []float64{0.1, 0.2, 0.3} {
		s := newSim(t, uint64(frac*1000)+7, peers, frac, p)
		r := s.runAll(n, DefaultCanaryRate)
		r.frac = frac
		var wrong int
		for _, w := range r.wrong {
			wrong += w
		}
		t.Logf("%.0f%% dishonest, %d shards, %d peers: wrong accepted %d %v; overhead %.3f× (second half %.3f×); re-checks %d, replaced %d; excluded %v of %v (honest excluded %d)",
			frac*100, n, peers, wrong, r.wrong, r.overhead, r.steady, r.rechecks, r.replaced, r.excluded, r.cheaters, r.honestExcluded)
		var lines []string
		for _, st := range []strategy{always, rare, lazy, collude, copier} {
			if r.cheaters[st] == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s: lies %d caught-directly %d; while trusted %d/%d; lies before first catch %v",
				st, r.lies[st], r.caught[st], r.tCaught[st], r.trustedLies[st], r.firstCatch[st]))
		}
		t.Log("  " + strings.Join(lines, "\n  "))
		// A wrong result survives only with a cheater that was never
		// caught (the re-check window replaces a caught one's); over 10^5
		// shards the rare liars tell enough lies to be caught (survival
		// (1−0.01·0.24)^2000 ≈ 0.8%), over the short run's 20,000 a rare
		// liar survives with probability ≈ 40% and may leave its lies.
		if r.wrongFromCaught != 0 {
			t.Errorf("%.0f%% dishonest: %d wrong results vouched for by caught peers were never replaced", frac*100, r.wrongFromCaught)
		}
		if wrong != 0 && n >= 100_000 {
			t.Errorf("%.0f%% dishonest: %d wrong results accepted", frac*100, wrong)
		}
		// Over 10^5 shards the cheaters are caught and excluded early and
		// the second half shows the steady cost (≈ 1 + 1/AuditOneIn +
		// the canary rate); over the short run's 20,000 the catches and
		// their re-checks still fall in the second half.
		limit := 1.3
		if n < 100_000 {
			limit = 1.45
		}
		if r.steady > limit {
			t.Errorf("%.0f%% dishonest: overhead once peers have a record %.3f× > %.2f×", frac*100, r.steady, limit)
		}
		if r.honestExcluded != 0 {
			t.Errorf("%d honest peers excluded", r.honestExcluded)
		}
		// Every cheater but the rare ones (which may, rarely, never be
		// caught) is excluded.
		for _, st := range []strategy{always, lazy, copier} {
			if r.excluded[st] != r.cheaters[st] {
				t.Errorf("%.0f%%: %d of %d %s cheaters excluded", frac*100, r.excluded[st], r.cheaters[st], st)
			}
		}
	}
}

// TestSpotCheckDetectionMatchesTheory measures, with cheaters that are
// never excluded (so that they keep lying and give large samples), how
// often a trusted cheater's lie is caught directly, and how many lies a
// cheater tells before it is caught, against the theory: each lie is
// caught with probability DetectionPerLie(1/AuditOneIn, accomplice,
// canary rate), so the lies up to a catch are geometric and a cheater
// survives m lies with probability (1−perLie)^m.
func TestSpotCheckDetectionMatchesTheory(t *testing.T) {
	n := 20_000
	if testing.Short() || raceEnabled {
		n = 12_000
	}
	const peers = 40
	p := DefaultParams
	p.ExcludeAfter = 1 << 30
	p.Window = 50
	s := newSim(t, 99, peers, 0.3, p)
	s.rareQ = 0.1
	r := s.runAll(n, DefaultCanaryRate)
	audit := 1 / float64(p.AuditOneIn)
	for _, c := range []struct {
		st         strategy
		accomplice float64
	}{{rare, 0}, {collude, 1 / float64(peers-1)}} {
		theory := DetectionPerLie(audit, c.accomplice, DefaultCanaryRate)
		lies, caught := r.trustedLies[c.st], r.tCaught[c.st]
		if lies < 40 {
			t.Fatalf("%s: only %d trusted lies; the measurement needs more", c.st, lies)
		}
		measured := float64(caught) / float64(lies)
		sigma := math.Sqrt(theory * (1 - theory) / float64(lies))
		runs := s.runs[c.st]
		mean := 0.0
		for _, x := range runs {
			mean += float64(x)
		}
		mean /= float64(len(runs))
		surv := func(m int) float64 {
			k := 0
			for _, x := range runs {
				if x > m {
					k++
				}
			}
			return float64(k) / float64(len(runs))
		}
		t.Logf("%s: %d trusted lies, caught directly %.4f (theory %.4f ± %.4f); %d catches, lies per catch %.2f (theory 1/p = %.2f); survives 1, 3, 5, 10 lies: %.3f %.3f %.3f %.3f (theory %.3f %.3f %.3f %.3f)",
			c.st, lies, measured, theory, sigma, len(runs), mean, 1/theory,
			surv(1), surv(3), surv(5), surv(10), Survival(theory, 1), Survival(theory, 3), Survival(theory, 5), Survival(theory, 10))
		if math.Abs(measured-theory) > 4*sigma {
			t.Errorf("%s: measured detection %.4f is more than 4σ from the theory %.4f", c.st, measured, theory)
		}
	}
}
