package coordinator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Random interleavings of commands from three honest peers and one liar —
// leases, reports on time and late, crashes, expiries, releases, renewals,
// retries and batches — always end with every shard verified with the
// honest hash, a receipt chain that verifies, and contributions summing to
// the planner prices of verified shards times their agreeing peers.
// Replaying the same log on a fresh machine gives the same state hash, and
// a refused or retried command never changes the state.
func TestPropertyHonestMajorityWins(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 30
	}
	for seed := 0; seed < seeds; seed++ {
		runProperty(t, uint64(seed))
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}

type simPeer struct {
	name   string
	liar   bool
	grants []LeaseGrant // what the peer believes it holds
}

type sim struct {
	t     *testing.T
	rng   *rand.Rand
	m     *Machine
	now   int64
	log   []Command // every command applied, in order
	peers []*simPeer
	seed  uint64
}

func honestHash(shardID content.Ref) content.Ref {
	return content.Hash([]byte("ok:" + string(shardID)))
}

func (s *sim) resultFor(p *simPeer, g LeaseGrant) content.Ref {
	if p.liar {
		return content.Hash([]byte(fmt.Sprintf("lie:%s:%d", g.ShardID, s.seed)))
	}
	return honestHash(g.ShardID)
}

// apply runs c through the wire encoding, checks that a refusal changed
// nothing, and logs it.
func (s *sim) apply(c Command) Result {
	s.t.Helper()
	b, err := EncodeCommand(c)
	if err != nil {
		s.t.Fatalf("encode %T: %v", c, err)
	}
	dc, err := DecodeCommand(b)
	if err != nil {
		s.t.Fatalf("decode %T: %v", c, err)
	}
	// Every eighth command runs between a capture and its check (see
	// captureProbe): all of them would add half again to the test's time
	// under -race, and the seeds cover every kind of command anyway.
	var before content.Ref
	captured := func() {}
	if len(s.log)%8 == 0 {
		before, captured = captureProbe(s.t, s.m)
	} else {
		before = s.m.StateHash()
	}
	r := s.m.Apply(dc)
	captured()
	if r.Refused() && s.m.StateHash() != before {
		s.t.Fatalf("seed %d: refused %T changed the state: %v", s.seed, c, r.Refusal)
	}
	s.log = append(s.log, dc)
	if len(s.log)%16 == 0 { // while shards are undecided too
		checkResultUse(s.t, s.m)
	}
	return r
}

// retry re-applies an idempotent command from the log and checks that it
// changed nothing.
func (s *sim) retry() {
	var c Command
	for tries := 0; tries < 5 && len(s.log) > 0; tries++ {
		switch x := s.log[s.rng.IntN(len(s.log))].(type) {
		case ReportResult, Tick, SubmitJob:
			c = x
		case Lease:
			if x.RequestID != "" {
				c = x
			}
		}
		if c != nil {
			break
		}
	}
	if c == nil {
		return
	}
	// A retried lease request is idempotent only while it is the peer's last.
	if l, ok := c.(Lease); ok {
		if memo := s.m.st.LeaseMemo[memoKey(l.Peer, l.Kinds)]; memo == nil || memo.RequestID != l.RequestID {
			return
		}
	}
	before := s.m.StateHash()
	s.apply(c)
	if after := s.m.StateHash(); after != before {
		s.t.Fatalf("seed %d: retried %T changed the state", s.seed, c)
	}
}

// step builds one random command for a random peer, or nil.
func (s *sim) step(batch bool) Command {
	p := s.peers[s.rng.IntN(len(s.peers))]
	switch k := s.rng.IntN(100); {
	case k < 30:
		l := Lease{Peer: p.name, Now: s.now, Max: 1 + s.rng.IntN(3)}
		if s.rng.IntN(3) == 0 {
			l.RequestID = fmt.Sprintf("%s-%d", p.name, len(s.log))
		}
		switch s.rng.IntN(6) {
		case 0: // a silo's generic lane: the same shards as asking for every kind
			l.Kinds = Kinds{KindGeneric}
		case 1: // a silo's round lane: no round here, so nothing
			l.Kinds = Kinds{KindRound}
		}
		if batch {
			return l
		}
		r := s.apply(l)
		if !r.Refused() {
			p.grants = append(p.grants, r.Response.(*LeaseResponse).Grants...)
		}
		return nil
	case k < 70:
		if len(p.grants) == 0 {
			return nil
		}
		i := s.rng.IntN(len(p.grants))
		g := p.grants[i]
		p.grants = slices.Delete(p.grants, i, i+1)
		if !p.liar && s.rng.IntN(20) == 0 {
			return nil // crashed mid-shard: the lease will expire
		}
		return ReportResult{Peer: p.name, Job: g.Job, Shard: g.Shard, Result: s.resultFor(p, g), Now: s.now}
	case k < 80:
		s.now += int64(s.rng.IntN(40))
		return Tick{Now: s.now}
	case k < 85:
		if s.rng.IntN(2) == 0 {
			p.grants = nil // SIGINT: hands back everything
			return ReleaseLeases{Peer: p.name, Now: s.now}
		}
		if len(p.grants) == 0 {
			return nil
		}
		g := p.grants[0]
		p.grants = p.grants[1:]
		return ReleaseLeases{Peer: p.name, Now: s.now, Shards: []ShardRef{{Job: g.Job, Shard: g.Shard}}}
	case k < 92:
		if len(p.grants) == 0 {
			return nil
		}
		g := p.grants[s.rng.IntN(len(p.grants))]
		return RenewLease{Peer: p.name, Job: g.Job, Shard: g.Shard, Now: s.now, TTL: int64(10 + s.rng.IntN(30))}
	case k < 96:
		if !batch {
			s.retry()
		}
		return nil
	default:
		if batch {
			return nil
		}
		var b Batch
		for n := 1 + s.rng.IntN(6); n > 0; n-- {
			if c := s.step(true); c != nil {
				b.Commands = append(b.Commands, c)
			}
		}
		r := s.apply(b)
		// Lease grants made inside a batch go to their peers.
		for i, sub := range r.Response.(*BatchResponse).Results {
			if l, ok := b.Commands[i].(Lease); ok && !sub.Refused() {
				for _, p := range s.peers {
					if p.name == l.Peer {
						p.grants = append(p.grants, sub.Response.(*LeaseResponse).Grants...)
					}
				}
			}
		}
		return nil
	}
}

func (s *sim) allDecided() bool {
	for _, j := range s.m.Jobs() {
		if j.State == JobRunning {
			return false
		}
	}
	return true
}

func runProperty(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5ce11))
	m, err := New(Config{Regime: trust.Consortium})
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, rng: rng, m: m, seed: seed}
	for _, n := range []string{"h1", "h2", "h3"} {
		s.peers = append(s.peers, &simPeer{name: n})
	}
	s.peers = append(s.peers, &simPeer{name: "liar", liar: true})
	rng.Shuffle(len(s.peers), func(i, j int) { s.peers[i], s.peers[j] = s.peers[j], s.peers[i] })

	prices := map[content.Ref]int64{}
	for ji := 0; ji < 1+rng.IntN(2); ji++ {
		sub := SubmitJob{
			Job: content.Hash([]byte(fmt.Sprintf("job %d/%d", seed, ji))), Name: fmt.Sprintf("j%d", ji),
			Policy: Policy{Replicas: 2, LeaseTTL: int64(20 + rng.IntN(40))}, Now: s.now,
		}
		for i := 0; i < 2+rng.IntN(10); i++ {
			id := content.Hash([]byte(fmt.Sprintf("shard %d/%d/%d", seed, ji, i)))
			p := int64(1 + rng.IntN(9))
			prices[id] = p
			sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: id, Price: p, PriceBasis: "program cost()"})
		}
		if r := s.apply(sub); r.Refused() {
			t.Fatalf("submit: %v", r.Refusal)
		}
	}

	for i := 0; i < 2000 && !s.allDecided(); i++ {
		s.now += int64(rng.IntN(3))
		if c := s.step(false); c != nil {
			s.apply(c)
		}
	}
	// Drain: honest peers lease and report at once until every shard is
	// decided (the random phase may have left work behind).
	for round := 0; !s.allDecided(); round++ {
		if round > 200 {
			t.Fatalf("seed %d: jobs not decided after draining", seed)
		}
		s.now += 100
		for _, p := range s.peers {
			if p.liar {
				continue
			}
			r := s.apply(Lease{Peer: p.name, Now: s.now, Max: 4})
			for _, g := range r.Response.(*LeaseResponse).Grants {
				s.apply(ReportResult{Peer: p.name, Job: g.Job, Shard: g.Shard, Result: s.resultFor(p, g), Now: s.now})
			}
		}
	}

	// Every shard verified with the honest hash by honest peers only; a liar
	// that reported before the decision is a loser.
	var want int64
	for _, js := range m.Jobs() {
		st, err := m.Job(js.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range st.Shards {
			if sh.State != StateVerified || sh.Result != honestHash(sh.ID) {
				t.Fatalf("seed %d: job %s shard %d is %s with %s", seed, js.Name, sh.Index, sh.State, sh.Result.Short())
			}
			if slices.Contains(sh.Agreeing, "liar") || len(sh.Agreeing) < 2 {
				t.Fatalf("seed %d: shard %d agreeing peers %v", seed, sh.Index, sh.Agreeing)
			}
			for _, rep := range sh.Reports {
				if rep.Peer == "liar" && !slices.Contains(sh.Losers, "liar") {
					t.Fatalf("seed %d: shard %d: liar reported but is not a loser", seed, sh.Index)
				}
			}
			want += prices[sh.ID] * int64(len(sh.Agreeing))
		}
	}
	// The chain verifies and holds one receipt per shard.
	rs := m.Receipts(0)
	if err := receipt.Verify(rs); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	if len(rs) != len(prices) {
		t.Fatalf("seed %d: %d receipts for %d shards", seed, len(rs), len(prices))
	}
	// Contributions add up to prices × agreeing peers, match the peer
	// records, and the liar earned nothing.
	var sum int64
	contrib := m.Contributions()
	for _, v := range contrib {
		sum += v
	}
	if sum != want {
		t.Fatalf("seed %d: contributions sum to %d, want %d", seed, sum, want)
	}
	for _, p := range m.Peers() {
		if p.WorkUnits != contrib[p.Peer] {
			t.Fatalf("seed %d: %s record says %d units, receipts %d", seed, p.Peer, p.WorkUnits, contrib[p.Peer])
		}
		if p.Peer == "liar" && (p.WorkUnits != 0 || p.Won != 0) {
			t.Fatalf("seed %d: the liar was credited: %+v", seed, p)
		}
	}
	checkCaptureShares(t, m)
	// Replaying the log on a fresh replica gives the same state; so does a
	// snapshot restore.
	replica, _ := New(Config{Regime: trust.Consortium})
	for _, c := range s.log {
		replica.Apply(c)
	}
	if replica.StateHash() != m.StateHash() {
		t.Fatalf("seed %d: replaying %d commands gives another state", seed, len(s.log))
	}
	restored, err := Load(m.Snapshot())
	if err != nil || restored.StateHash() != m.StateHash() {
		t.Fatalf("seed %d: snapshot restore: %v", seed, err)
	}
	checkResultUse(t, m)
	checkResultUse(t, restored)
}

// checkResultUse checks the machine's index of reports by result against
// a scan of every report of every job: the same answer for every result
// reported, and none for a hash nobody reported.
func checkResultUse(t *testing.T, m *Machine) {
	t.Helper()
	refs := []content.Ref{content.Hash([]byte("reported by nobody"))}
	for _, j := range m.st.Jobs {
		for _, s := range j.Shards {
			for _, r := range s.Reports {
				refs = append(refs, r.Result)
			}
		}
	}
	for _, ref := range refs {
		got, want := m.ResultUse(ref), scanResultUse(m, ref)
		slices.SortFunc(got.Decided, func(a, b ResultJob) int { return strings.Compare(string(a.Job), string(b.Job)) })
		slices.SortFunc(want.Decided, func(a, b ResultJob) int { return strings.Compare(string(a.Job), string(b.Job)) })
		if got.Undecided != want.Undecided || !slices.Equal(got.Decided, want.Decided) {
			t.Fatalf("ResultUse(%s) = %+v, a scan of every report gives %+v", ref.Short(), got, want)
		}
	}
}

// scanResultUse is ResultUse by a scan of every report of every job (what
// ResultUse did before its index): the reference the index is checked
// against, and the baseline of BenchmarkResultUse.
func scanResultUse(m *Machine, ref content.Ref) ResultUse {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var u ResultUse
	for _, j := range m.st.Jobs {
		for _, s := range j.Shards {
			for _, r := range s.Reports {
				if r.Result != ref {
					continue
				}
				if s.State == StatePending {
					return ResultUse{Undecided: true}
				}
				if !slices.ContainsFunc(u.Decided, func(d ResultJob) bool { return d.Job == j.ID }) {
					u.Decided = append(u.Decided, ResultJob{Job: j.ID, Regime: j.Regime, Submitter: j.Submitter})
				}
			}
		}
	}
	return u
}
