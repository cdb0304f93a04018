package coordinator

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify/spot"
)

// rig drives adaptive jobs on a set of replicas: every command goes
// through the canonical encoding and is applied to each replica, whose
// state hashes must agree after every step.
type rig struct {
	t    *testing.T
	ms   []*Machine
	job  content.Ref
	now  int64
	seed byte
}

func newRig(t *testing.T, replicas int) *rig {
	r := &rig{t: t, now: 10}
	for range replicas {
		m, err := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 1000, CommitReveal: true})
		if err != nil {
			t.Fatal(err)
		}
		r.ms = append(r.ms, m)
	}
	return r
}

// apply applies c to every replica and returns the first's result.
func (r *rig) apply(c Command) Result {
	r.t.Helper()
	r.now++
	var first Result
	for i, m := range r.ms {
		res := applyEncoded(r.t, m, c)
		if i == 0 {
			first = res
		}
	}
	h := r.ms[0].StateHash()
	for i, m := range r.ms[1:] {
		if m.StateHash() != h {
			r.t.Fatalf("replica %d's state hash differs after %T", i+1, c)
		}
	}
	return first
}

func (r *rig) submit(name string, shards int, canaries map[int]content.Ref) content.Ref {
	job := content.Hash([]byte(name))
	sub := SubmitJob{Job: job, Name: name, Bundle: content.Hash([]byte("b")), Policy: Policy{Mode: ModeAdaptive}, Submitter: "alice", Now: r.now}
	for i := range shards {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprintf("%s/%d", name, i))), Price: 3, PriceBasis: "flat"})
	}
	for i, res := range canaries {
		sub.Canaries = append(sub.Canaries, Canary{Shard: i, Result: res})
	}
	if res := r.apply(sub); res.Refused() {
		r.t.Fatal(res.Refusal)
	}
	r.job = job
	return job
}

// seedFor finds a seed whose draw audits (or not) a peer with record rec.
func seedFor(rec spot.Record, audit bool) []byte {
	for i := 0; ; i++ {
		s := bytes.Repeat([]byte{byte(i), byte(i >> 8)}, spot.SeedBytes/2)
		if spot.ShouldAudit(rec, SpotParams, s) == audit {
			return s
		}
	}
}

func (r *rig) seedNext() []byte {
	r.seed++
	return bytes.Repeat([]byte{r.seed}, spot.SeedBytes)
}

func result(s string) content.Ref { return content.Hash([]byte(s)) }

// lease leases one shard of the rig's job to peer and returns its index.
func (r *rig) lease(peer string) int {
	r.t.Helper()
	res := r.apply(Lease{Peer: peer, Now: r.now, Job: r.job})
	g := res.Response.(*LeaseResponse).Grants
	if len(g) != 1 {
		r.t.Fatalf("%s got %d grants", peer, len(g))
	}
	return g[0].Shard
}

func (r *rig) commit(peer string, shard int, res content.Ref) *CommitResponse {
	r.t.Helper()
	_, b := nonceOf(byte(len(peer)))
	out := r.apply(CommitResult{Peer: peer, Job: r.job, Shard: shard, Commitment: Commitment(res, peer, r.job, shard, b), Now: r.now})
	if out.Refused() {
		r.t.Fatal(out.Refusal)
	}
	return out.Response.(*CommitResponse)
}

func (r *rig) reveal(peer string, shard int, res content.Ref) Result {
	n, _ := nonceOf(byte(len(peer)))
	return r.apply(ReportResult{Peer: peer, Job: r.job, Shard: shard, Result: res, Nonce: n, Now: r.now})
}

func (r *rig) draw(shard int, seed []byte) *DrawResponse {
	r.t.Helper()
	out := r.apply(DrawAudit{Job: r.job, Shard: shard, Seed: seed, Now: r.now})
	if out.Refused() {
		r.t.Fatal(out.Refusal)
	}
	return out.Response.(*DrawResponse)
}

func (r *rig) shardStatus(i int) ShardStatus {
	js, err := r.ms[0].Job(r.job)
	if err != nil {
		r.t.Fatal(err)
	}
	return js.Shards[i]
}

func (r *rig) record(peer string) PeerRecord {
	for _, p := range r.ms[0].Peers() {
		if p.Peer == peer {
			return p
		}
	}
	return PeerRecord{Peer: peer}
}

// trust gives peer a record of valid checks on every replica, as if it
// had passed them (the rest of the tests earn trust the long way).
func (r *rig) trust(peer string) {
	for _, m := range r.ms {
		m.peer(peer).Streak = SpotParams.TrustAfter
	}
}

// The check is drawn only after the commitment: a draw before it is
// refused and changes nothing, and everything the peer receives up to its
// commitment is the same whether the draw that follows audits its shard
// or not. The reveal opens only after the draw.
func TestSpotCheckDrawnAfterCommitment(t *testing.T) {
	var seen [2][]string
	var decided [2]string
	for k, audit := range []bool{true, false} {
		r := newRig(t, 2)
		for _, p := range []string{"w1", "w2"} {
			r.apply(Lease{Peer: p, Now: r.now}) // known peers, nothing to lease yet
			r.trust(p)
		}
		job := r.submit("j", 2, nil)
		wantCode(t, r.apply(DrawAudit{Job: job, Shard: 0, Seed: r.seedNext(), Now: r.now}), diag.PoolDrawEarly)
		before := r.ms[0].StateHash()
		grant := r.apply(Lease{Peer: "w1", Now: r.now, Job: job})
		shard := grant.Response.(*LeaseResponse).Grants[0].Shard
		if r.ms[0].Leasable("w2", r.now) != 1 || len(r.ms[0].PendingDraws(r.now)) != 0 {
			t.Fatal("before the commitment: w2 should lease the other shard, nothing should wait for a draw")
		}
		com := r.commit("w1", shard, result("ok0"))
		wantCode(t, r.reveal("w1", shard, result("ok0")), diag.PoolRevealEarly)
		seen[k] = append(seen[k], fmt.Sprintf("%+v", grant.Response), fmt.Sprintf("%+v", *com))
		if pd := r.ms[0].PendingDraws(r.now); len(pd) != 1 || pd[0].Shard != shard {
			t.Fatalf("pending draws after the commitment: %v", pd)
		}
		_ = before
		d := r.draw(shard, seedFor(r.record("w1").Record, audit))
		if d.Audited != audit {
			t.Fatalf("draw audited %v, want %v", d.Audited, audit)
		}
		wantCode(t, r.apply(DrawAudit{Job: job, Shard: shard, Seed: r.seedNext(), Now: r.now}), diag.PoolDrawEarly)
		if audit {
			if d.Auditor != "w2" {
				t.Fatalf("auditor %q, want w2 (the only other peer)", d.Auditor)
			}
			wantCode(t, r.reveal("w1", shard, result("ok0")), diag.PoolRevealEarly)
			if got := r.lease("w2"); got != shard {
				t.Fatalf("the auditor leased shard %d, want the audited %d first", got, shard)
			}
			r.commit("w2", shard, result("ok0"))
			r.reveal("w1", shard, result("ok0"))
			r.reveal("w2", shard, result("ok0"))
		} else if res := r.reveal("w1", shard, result("ok0")); res.Refused() {
			t.Fatal(res.Refusal)
		}
		st := r.shardStatus(shard)
		if st.State != StateVerified {
			t.Fatalf("shard %s", st.State)
		}
		decided[k] = st.Method
		rc := r.ms[0].Receipts(0)
		if rc[len(rc)-1].Method != st.Method {
			t.Fatalf("receipt method %q, shard method %q", rc[len(rc)-1].Method, st.Method)
		}
	}
	if seen[0][0] != seen[1][0] || seen[0][1] != seen[1][1] {
		t.Fatalf("the peer received different answers before its commitment:\n%v\n%v", seen[0], seen[1])
	}
	if decided[0] != MethodSpotAudited || decided[1] != MethodSpotAlone {
		t.Fatalf("methods %v", decided)
	}
}

// New peers are always audited and earn trust by valid checks; a trusted
// peer runs alone unless drawn; the auditor is the drawn peer only.
func TestAdaptiveReplicationEarnsTrust(t *testing.T) {
	r := newRig(t, 1)
	r.apply(Lease{Peer: "w1", Now: r.now})
	r.apply(Lease{Peer: "w2", Now: r.now})
	r.submit("trust", SpotParams.TrustAfter+1, nil)
	for i := 0; i < SpotParams.TrustAfter; i++ {
		s := r.lease("w1")
		r.commit("w1", s, result(fmt.Sprint(i)))
		d := r.draw(s, r.seedNext())
		if !d.Audited || d.Auditor != "w2" {
			t.Fatalf("shard %d of an untrusted peer: %+v", s, d)
		}
		for _, m := range r.ms {
			if j := m.jobs[string(r.job)]; m.eligible(j, j.Shards[s], "w3", r.now) {
				t.Fatal("a peer other than the drawn auditor could lease the audit")
			}
		}
		r.lease("w2")
		r.commit("w2", s, result(fmt.Sprint(i)))
		r.reveal("w1", s, result(fmt.Sprint(i)))
		r.reveal("w2", s, result(fmt.Sprint(i)))
	}
	if rec := r.record("w1"); !rec.Trusted(SpotParams) || rec.Streak != SpotParams.TrustAfter {
		t.Fatalf("after %d valid checks: %+v", SpotParams.TrustAfter, rec.Record)
	}
	s := r.lease("w1")
	r.commit("w1", s, result("last"))
	if d := r.draw(s, seedFor(r.record("w1").Record, false)); d.Audited {
		t.Fatal("a trusted peer's shard audited with a seed that draws no audit")
	}
	r.reveal("w1", s, result("last"))
	if st := r.shardStatus(s); st.State != StateVerified || st.Method != MethodSpotAlone || len(st.Agreeing) != 1 {
		t.Fatalf("%+v", st)
	}
}

// A lying worker and a rubber-stamping auditor agree on wrong results; a
// canary catches both, the liar's accepted results are re-checked by
// fresh auditors and replaced, the wrong receipts are reversed by
// compensating entries, and the repeat offenders are excluded until an
// operator re-admits them. The chain verifies and contributions net out.
func TestCanaryCatchesLiarAndStamp(t *testing.T) {
	r := newRig(t, 2)
	for _, p := range []string{"liar", "stamp", "h1", "h2"} {
		r.apply(Lease{Peer: p, Now: r.now})
	}
	// Shard 2 is a canary; only liar and stamp work at first.
	r.submit("c", 3, map[int]content.Ref{2: result("ok2")})
	wrong := func(i int) content.Ref { return result(fmt.Sprintf("bad%d", i)) }
	for i := 0; i < 3; i++ {
		s := r.lease("liar")
		r.commit("liar", s, wrong(s))
		d := r.draw(s, r.seedNext())
		if !d.Audited || d.Auditor != "h1" && d.Auditor != "h2" && d.Auditor != "stamp" {
			t.Fatalf("draw %+v", d)
		}
		// Make the stamp the auditor the way colluders would hope to be
		// paired: redraw until it is (the draws are the leader's; this
		// stands for the chance pairing).
		for d.Auditor != "stamp" {
			for _, m := range r.ms {
				m.jobs[string(r.job)].Shards[s].AuditorUntil = 0
			}
			d = r.draw(s, r.seedNext())
		}
		r.lease("stamp")
		r.commit("stamp", s, wrong(s))
		r.reveal("liar", s, wrong(s))
		r.reveal("stamp", s, wrong(s))
	}
	if st := r.shardStatus(0); st.State != StateVerified && st.State != StatePending {
		t.Fatalf("shard 0: %+v", st)
	}
	liar, stamp := r.record("liar"), r.record("stamp")
	if liar.Failed == 0 || stamp.Stamped == 0 {
		t.Fatalf("the canary caught nobody: liar %+v, stamp %+v", liar.Record, stamp.Record)
	}
	// The honest peers finish: the canary and the re-checks.
	for step := 0; step < 20; step++ {
		pd := r.ms[0].PendingDraws(r.now)
		for _, p := range pd {
			r.draw(p.Shard, r.seedNext())
		}
		progressed := false
		for _, h := range []string{"h1", "h2"} {
			res := r.apply(Lease{Peer: h, Now: r.now, Job: r.job})
			for _, g := range res.Response.(*LeaseResponse).Grants {
				ok := result(fmt.Sprintf("ok%d", g.Shard))
				r.commit(h, g.Shard, ok)
				for _, p := range r.ms[0].PendingDraws(r.now) {
					r.draw(p.Shard, r.seedNext())
				}
				if res := r.reveal(h, g.Shard, ok); res.Refused() {
					// waits for a second fresh report: reveal after it
					continue
				}
				progressed = true
			}
		}
		// Reveal what waited.
		js, _ := r.ms[0].Job(r.job)
		for _, s := range js.Shards {
			for _, c := range s.Commits {
				if s.State == StatePending || s.State == StateLeased {
					r.reveal(c.Peer, s.Index, result(fmt.Sprintf("ok%d", s.Index)))
				}
			}
		}
		if js, _ := r.ms[0].Job(r.job); js.State == JobDecided {
			break
		}
		_ = progressed
	}
	js, _ := r.ms[0].Job(r.job)
	if js.State != JobDecided {
		t.Fatalf("job %s: %+v", js.State, js.Shards)
	}
	for _, s := range js.Shards {
		if s.Result != result(fmt.Sprintf("ok%d", s.Index)) {
			t.Errorf("shard %d accepted %s (%s by %v)", s.Index, s.Result.Short(), s.Method, s.Agreeing)
		}
	}
	liar, stamp = r.record("liar"), r.record("stamp")
	if !liar.Excluded || !stamp.Excluded {
		t.Fatalf("repeat offenders not excluded: liar %+v, stamp %+v", liar.Record, stamp.Record)
	}
	if r.ms[0].Leasable("liar", r.now) != 0 {
		t.Fatal("an excluded peer can lease")
	}
	rs := r.ms[0].Receipts(0)
	if err := receipt.Verify(rs); err != nil {
		t.Fatal(err)
	}
	reversals := 0
	for _, rc := range rs {
		if rc.Reverses != 0 {
			reversals++
		}
	}
	if reversals == 0 {
		t.Fatal("no compensating receipt for the replaced results")
	}
	if c := r.ms[0].Contributions(); c["liar"] != 0 || c["stamp"] != 0 {
		t.Fatalf("cheaters keep credit: %v", c)
	}
	// Only an operator re-admits; the peer starts over, untrusted.
	wantCode(t, r.apply(Readmit{Peer: "liar", By: "alice", Now: r.now}), diag.PoolForbidden)
	wantCode(t, r.apply(Readmit{Peer: "h1", By: "op", Operator: true, Now: r.now}), diag.PoolNotExcluded)
	if res := r.apply(Readmit{Peer: "liar", By: "op", Operator: true, Now: r.now}); res.Refused() {
		t.Fatal(res.Refusal)
	}
	if rec := r.record("liar"); rec.Excluded || rec.Streak != 0 || rec.Failed == 0 {
		t.Fatalf("after re-admission: %+v", rec.Record)
	}
	// The state survives a snapshot.
	snap := r.ms[0].Snapshot()
	m2, _ := New(Config{Regime: trust.Consortium})
	if err := m2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if m2.StateHash() != r.ms[0].StateHash() {
		t.Fatal("restored state hash differs")
	}
}

// Adaptive mode is refused where it cannot hold.
func TestAdaptiveModeRefusals(t *testing.T) {
	for _, c := range []struct {
		regime trust.Regime
		pol    Policy
		pinned bool
		canary bool
	}{
		{trust.Open, Policy{Mode: ModeAdaptive, Replicas: 2}, false, false},
		{trust.Consortium, Policy{Mode: ModeAdaptive, Replicas: 1}, false, false},
		{trust.Consortium, Policy{Mode: "sometimes"}, false, false},
		{trust.Consortium, Policy{Mode: ModeAdaptive}, true, false},
		{trust.Open, Policy{Check: CheckFreivalds, Rounds: 2}, false, true},
		{trust.Open, Policy{}, true, true},
	} {
		m, _ := New(Config{Regime: c.regime})
		sub := SubmitJob{Job: content.Hash([]byte("x")), Name: "x", Bundle: content.Hash([]byte("b")), Policy: c.pol, Now: 1,
			Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("s")), Price: 1, PriceBasis: "flat"}}}
		if c.pinned {
			sub.Shards[0].Peer = "silo-1"
		}
		if c.canary {
			sub.Canaries = []Canary{{Shard: 0, Result: result("x")}}
		}
		wantCode(t, m.Apply(sub), diag.PoolBadMode)
	}
}

// Random interleavings on an adaptive job with canaries — leases, commits,
// the leader's draws at random moments with random seeds, reveals, ticks
// past expiries and releases, from three honest peers and a liar — end with
// every shard accepted with the honest result, a receipt chain that
// verifies, contributions that match the peer records, and a refused
// command never changes the state. Replaying the log on a fresh replica
// gives the same state hash (law 10).
func TestPropertyAdaptiveDeterministic(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 10
	}
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		propertyAdaptive(t, seed)
	}
}

func propertyAdaptive(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xada))
	m, _ := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 50, CommitReveal: true})
	var log []Command
	now := int64(1)
	apply := func(c Command) Result {
		before := m.StateHash()
		r := applyEncoded(t, m, c)
		if r.Refused() && m.StateHash() != before {
			t.Fatalf("seed %d: refused %T changed the state: %v", seed, c, r.Refusal)
		}
		log = append(log, c)
		return r
	}
	honest := func(id content.Ref) content.Ref { return content.Hash([]byte("ok:" + string(id))) }
	job := content.Hash([]byte(fmt.Sprintf("adaptive %d", seed)))
	sub := SubmitJob{Job: job, Name: "a", Bundle: content.Hash([]byte("b")), Policy: Policy{Mode: ModeAdaptive}, Now: now}
	n := 4 + rng.IntN(8)
	for i := 0; i < n; i++ {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprintf("s%d/%d", seed, i))), Price: int64(1 + rng.IntN(5)), PriceBasis: "flat"})
	}
	for _, i := range spot.PickCanaries(n, 2, []byte{byte(seed)}) {
		sub.Canaries = append(sub.Canaries, Canary{Shard: i, Result: honest(sub.Shards[i].ID)})
	}
	if r := apply(sub); r.Refused() {
		t.Fatal(r.Refusal)
	}
	peers := []string{"h1", "h2", "h3", "liar"}
	resultOf := func(p string, shard int) content.Ref {
		if p == "liar" {
			return content.Hash([]byte(fmt.Sprintf("lie %d", shard)))
		}
		return honest(sub.Shards[shard].ID)
	}
	committed := map[string]map[int]bool{}
	for _, p := range peers {
		committed[p] = map[int]bool{}
	}
	act := func(p string, liarToo bool) {
		if p == "liar" && !liarToo {
			return
		}
		switch rng.IntN(6) {
		case 0, 1:
			r := apply(Lease{Peer: p, Now: now, Job: job, Max: 1})
			if !r.Refused() {
				for _, g := range r.Response.(*LeaseResponse).Grants {
					_, b := nonceOf(byte(len(p)))
					if rng.IntN(8) > 0 { // sometimes it crashes before committing
						if !apply(CommitResult{Peer: p, Job: job, Shard: g.Shard, Commitment: Commitment(resultOf(p, g.Shard), p, job, g.Shard, b), Now: now}).Refused() {
							committed[p][g.Shard] = true
						}
					}
				}
			}
		case 2:
			for _, d := range m.PendingDraws(now) {
				seed := make([]byte, spot.SeedBytes)
				for i := range seed {
					seed[i] = byte(rng.Uint32())
				}
				apply(DrawAudit{Job: d.Job, Shard: d.Shard, Seed: seed, Now: now})
			}
		case 3, 4:
			for s := range committed[p] {
				nonce, _ := nonceOf(byte(len(p)))
				r := apply(ReportResult{Peer: p, Job: job, Shard: s, Result: resultOf(p, s), Nonce: nonce, Now: now})
				if !r.Refused() || r.Refusal[0].Code != diag.PoolRevealEarly {
					delete(committed[p], s)
				}
			}
		case 5:
			now += int64(rng.IntN(60))
			apply(Tick{Now: now})
		}
	}
	decided := func() bool {
		js, _ := m.Job(job)
		return js.State != JobRunning
	}
	for i := 0; i < 400 && !decided(); i++ {
		now += int64(rng.IntN(3))
		act(peers[rng.IntN(len(peers))], true)
	}
	for i := 0; !decided(); i++ {
		if i > 5000 {
			for _, s := range m.jobs[string(job)].Shards {
				if s.State == StatePending {
					t.Logf("shard %d: audit %q auditor %q until %d now %d draws %d commits %d recheck %d pending-draw %v held %v", s.Index, s.Audit, s.Auditor, s.AuditorUntil, now, s.Draws, len(s.Commits), s.Recheck, drawPending(m.jobs[string(job)], s, now), s.Holders)
				}
			}
			t.Fatalf("seed %d: not decided after draining; peers %+v", seed, m.Peers())
		}
		now++
		act(peers[rng.IntN(3)], false)
	}
	js, _ := m.Job(job)
	if js.State != JobDecided {
		t.Fatalf("seed %d: job %s", seed, js.State)
	}
	for _, s := range js.Shards {
		if s.State != StateVerified || s.Result != honest(s.ID) || slices.Contains(s.Agreeing, "liar") {
			t.Fatalf("seed %d: shard %d %s %s by %v (%s)", seed, s.Index, s.State, s.Result.Short(), s.Agreeing, s.Method)
		}
	}
	if err := receipt.Verify(m.Receipts(0)); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	contrib := m.Contributions()
	for _, p := range m.Peers() {
		if p.WorkUnits != contrib[p.Peer] {
			t.Fatalf("seed %d: %s record %d units, receipts %d", seed, p.Peer, p.WorkUnits, contrib[p.Peer])
		}
	}
	replica, _ := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 50, CommitReveal: true})
	for _, c := range log {
		replica.Apply(c)
	}
	if replica.StateHash() != m.StateHash() {
		t.Fatalf("seed %d: replaying %d commands gives another state", seed, len(log))
	}
}

// A trusted peer's result accepted alone, in a job already reduced, is
// found wrong after the peer is caught on a canary of another job: the
// job returns to running with its reduction cleared, fresh auditors
// replace the result, its receipt is reversed, and the job is reduced
// again.
func TestRecheckReopensReducedJob(t *testing.T) {
	r := newRig(t, 2)
	for _, p := range []string{"w1", "h2", "h3"} {
		r.apply(Lease{Peer: p, Now: r.now})
	}
	r.trust("w1")
	first := r.submit("first", 1, nil)
	r.lease("w1")
	r.commit("w1", 0, result("lie"))
	r.draw(0, seedFor(r.record("w1").Record, false))
	r.reveal("w1", 0, result("lie"))
	reduced := result("reduced-with-lie")
	if res := r.apply(ReportReduced{Job: first, Peer: "agg", Reduced: reduced, Now: r.now}); res.Refused() {
		t.Fatal(res.Refusal)
	}
	// w1 fails a canary in a second job.
	r.submit("second", 1, map[int]content.Ref{0: result("truth")})
	r.lease("w1")
	r.commit("w1", 0, result("lie2"))
	r.draw(0, seedFor(r.record("w1").Record, false))
	r.reveal("w1", 0, result("lie2"))
	r.job = first
	js, _ := r.ms[0].Job(first)
	if js.State != JobRunning || js.Reduced != "" {
		t.Fatalf("the reduced job was not reopened: %s %s", js.State, js.Reduced.Short())
	}
	// Two fresh auditors outvote the accepted result.
	for _, h := range []string{"h2", "h3"} {
		for _, p := range r.ms[0].PendingDraws(r.now) {
			if p.Job == first {
				for _, m := range r.ms {
					m.jobs[string(first)].Shards[0].Auditor = h // stands for the draw picking h
					m.jobs[string(first)].Shards[0].AuditorUntil = r.now + 1000
				}
			}
		}
		if got := r.lease(h); got != 0 {
			t.Fatalf("%s leased %d", h, got)
		}
		r.commit(h, 0, result("truth0"))
		r.reveal(h, 0, result("truth0"))
	}
	js, _ = r.ms[0].Job(first)
	if js.State != JobDecided || js.Shards[0].Result != result("truth0") || js.Shards[0].Method != MethodRechecked {
		t.Fatalf("after the re-check: %s %+v", js.State, js.Shards[0])
	}
	rs := r.ms[0].Receipts(0)
	if err := receipt.Verify(rs); err != nil {
		t.Fatal(err)
	}
	if rev := rs[len(rs)-2]; rev.Reverses != 1 || rev.Peers[0] != "w1" {
		t.Fatalf("compensating receipt %+v", rev)
	}
	if c := r.ms[0].Contributions(); c["w1"] != 0 {
		t.Fatalf("w1 keeps %d units", c["w1"])
	}
	if res := r.apply(ReportReduced{Job: first, Peer: "agg", Reduced: result("reduced-again"), Now: r.now}); res.Refused() {
		t.Fatal(res.Refusal)
	}
}

// A job's own spot-check knobs (Policy.TrustAfter, AuditOneIn) replace the
// pool's for its draws and show in its method; they are refused outside
// their range and on a quorum job.
func TestSpotKnobsPerJob(t *testing.T) {
	r := newRig(t, 2)
	r.apply(Lease{Peer: "w1", Now: r.now})
	r.apply(Lease{Peer: "w2", Now: r.now})
	pol := Policy{Mode: ModeAdaptive, TrustAfter: 1, AuditOneIn: 1000}
	sub := SubmitJob{Job: content.Hash([]byte("knobs")), Name: "knobs", Bundle: content.Hash([]byte("b")), Policy: pol, Submitter: "alice", Now: r.now}
	for i := range 2 {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprintf("knobs/%d", i))), Price: 3, PriceBasis: "flat"})
	}
	for _, bad := range []Policy{{Mode: ModeAdaptive, AuditOneIn: MaxSpotKnob + 1}, {TrustAfter: 2}} {
		b := sub
		b.Policy = bad
		wantCode(t, r.apply(b), diag.PoolBadJob)
	}
	res := r.apply(sub)
	if res.Refused() || !strings.Contains(res.Response.(*SubmitResponse).Method, "trusted after 1 valid checks, then audited 1 in 1000") {
		t.Fatalf("submission: %+v", res)
	}
	r.job = sub.Job
	// One valid audited check makes w1 trusted for this job (the pool's
	// threshold is 5).
	s := r.lease("w1")
	r.commit("w1", s, result("a"))
	if d := r.draw(s, r.seedNext()); !d.Audited {
		t.Fatal("an untrusted peer's shard was not audited")
	}
	r.lease("w2")
	r.commit("w2", s, result("a"))
	r.reveal("w1", s, result("a"))
	r.reveal("w2", s, result("a"))
	rec := r.record("w1").Record
	if rec.Streak != 1 || rec.Trusted(SpotParams) {
		t.Fatalf("w1 after one check: %+v", rec)
	}
	seed := seedFor(rec, true) // audited under the pool's knobs (w1 is untrusted there)…
	for spot.ShouldAudit(rec, spot.Params{TrustAfter: 1, AuditOneIn: 1000}, seed) {
		seed[0]++ // …but not under the job's
	}
	s = r.lease("w1")
	r.commit("w1", s, result("b"))
	if d := r.draw(s, seed); d.Audited {
		t.Fatal("the job's trust threshold and audit rate were not applied")
	}
}
