package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

func volunteerNamed(seed byte) string {
	return receipt.VolunteerPeer(identity.NewFromSeed([32]byte{seed}).Public().String())
}

// earnStanding gives peer the verified record that standing asks for, as
// if it had StandingAfter results verified with a voice.
func earnStanding(m *Machine, peer string) {
	m.peer(peer).Standing = StandingAfter
}

func leaseOf(t *testing.T, m *Machine, peer, origin string, now int64, max int) []LeaseGrant {
	t.Helper()
	r := applyEncoded(t, m, Lease{Peer: peer, Now: now, Max: max, Origin: origin})
	if r.Refused() {
		t.Fatal(r.Refusal)
	}
	return r.Response.(*LeaseResponse).Grants
}

func reportAll(t *testing.T, m *Machine, peer string, gs []LeaseGrant, res content.Ref, now int64) {
	t.Helper()
	for _, g := range gs {
		if r := applyEncoded(t, m, ReportResult{Peer: peer, Job: g.Job, Shard: g.Shard, Result: res, Now: now}); r.Refused() {
			t.Fatal(r.Refusal)
		}
	}
}

// Two fresh volunteer keys of two networks (the Sybil that prefix rules
// do not stop) cannot decide a shard of an open pool: the second is not
// granted what the first holds or answered, and a shard whose agreeing
// reports carry no voice stays pending until a member or a volunteer with
// standing agrees — here a member's honest result, which wins.
func TestFreshVolunteersCannotDecide(t *testing.T) {
	m, job := openJob(t, 4, 60000)
	a, b := volunteerNamed(91), volunteerNamed(92)
	wrong, right := result("wrong"), result("right")
	ga := leaseOf(t, m, a, "198.51.100.0/24", 2, 8)
	if len(ga) != 4 {
		t.Fatalf("the first key got %d shards, want 4", len(ga))
	}
	if gb := leaseOf(t, m, b, "203.0.113.0/24", 3, 8); len(gb) != 0 {
		t.Fatalf("a second fresh key got %d shards a fresh key holds", len(gb))
	}
	reportAll(t, m, a, ga, wrong, 4)
	if gb := leaseOf(t, m, b, "203.0.113.0/24", 5, 8); len(gb) != 0 {
		t.Fatalf("a second fresh key got %d shards a fresh key answered", len(gb))
	}
	// The decision rule holds on its own: b had standing when it leased,
	// and lost it (a result that lost) before it reported.
	earnStanding(m, b)
	gb := leaseOf(t, m, b, "203.0.113.0/24", 6, 8)
	if len(gb) != 4 {
		t.Fatalf("a key with standing got %d shards, want 4", len(gb))
	}
	m.peer(b).Standing = 0
	if m.hasStanding(b) {
		t.Fatal("a volunteer whose result lost since its last win has standing")
	}
	reportAll(t, m, b, gb, wrong, 7)
	st, _ := m.Job(job)
	for _, s := range st.Shards {
		if s.State != StatePending {
			t.Fatalf("shard %d is %s after two voiceless agreeing reports, want pending", s.Index, s.State)
		}
	}
	// Members break the tie with the right result: one more report at
	// 2 against 0 (agreed without a voice), then at 2 against 1 and 2
	// against 2 until 3 against 2.
	for i, w := range []string{"w1", "w2", "w3"} {
		g := leaseOf(t, m, w, "", int64(8+i), 8)
		if len(g) != 4 {
			t.Fatalf("member %s got %d shards, want 4", w, len(g))
		}
		reportAll(t, m, w, g, right, int64(8+i))
	}
	st, _ = m.Job(job)
	for _, s := range st.Shards {
		if s.State != StateVerified || s.Result != right {
			t.Errorf("shard %d: %s with %s, want verified with the members' result", s.Index, s.State, s.Result.Short())
		}
	}
	if m.hasStanding(a) {
		t.Error("the liar has standing")
	}
}

// Voiceless agreement runs out of attempts: flagged unverified, never
// verified, and the reason names standing.
func TestVoicelessAgreementIsFlagged(t *testing.T) {
	m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: 60000})
	job := content.Hash([]byte("flag"))
	applyEncoded(t, m, SubmitJob{Job: job, Name: "f", Bundle: content.Hash([]byte("b")), Submitter: "alice",
		Policy: Policy{Replicas: 2, Attempts: 2}, Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("s")), Price: 1, PriceBasis: "flat"}}, Now: 1})
	a, b := volunteerNamed(93), volunteerNamed(94)
	ga := leaseOf(t, m, a, "198.51.100.0/24", 2, 1)
	earnStanding(m, b)
	gb := leaseOf(t, m, b, "203.0.113.0/24", 3, 1)
	m.peer(b).Standing = 0
	reportAll(t, m, a, ga, result("x"), 4)
	reportAll(t, m, b, gb, result("x"), 5)
	st, _ := m.Job(job)
	if s := st.Shards[0]; s.State != StateUnverified {
		t.Fatalf("shard is %s, want unverified", s.State)
	}
}

// Canaries in an open quorum job: a fresh volunteer's report that matches
// the known answer decides the canary alone (canary-audited) and counts
// toward standing; after StandingAfter of them the volunteer has standing.
// One that differs is a failed check (PeerCaught), and two exclude it.
func TestStandingEarnedOnCanaries(t *testing.T) {
	const n = 8
	var shards []ShardPlan
	var canaries []Canary
	for i := range n {
		shards = append(shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i), 7}), Price: 1, PriceBasis: "flat"})
		canaries = append(canaries, Canary{Shard: i, Result: result("known")})
	}
	m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: 60000})
	job := content.Hash([]byte("canaries"))
	if r := applyEncoded(t, m, SubmitJob{Job: job, Name: "c", Bundle: content.Hash([]byte("b")), Submitter: "alice",
		Policy: Policy{Replicas: 2}, Shards: shards, Canaries: canaries, Now: 1}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	honest, liar := volunteerNamed(95), volunteerNamed(96)
	for i := range StandingAfter {
		if m.hasStanding(honest) {
			t.Fatalf("standing after %d canaries, want %d", i, StandingAfter)
		}
		g := leaseOf(t, m, honest, "198.51.100.0/24", int64(2+i), 1)
		reportAll(t, m, honest, g, result("known"), int64(2+i))
		st, _ := m.Job(job)
		if s := st.Shards[g[0].Shard]; s.State != StateVerified || s.Method != MethodCanary {
			t.Fatalf("canary %d: %s by %q, want verified by %s", g[0].Shard, s.State, s.Method, MethodCanary)
		}
	}
	if !m.hasStanding(honest) {
		t.Fatalf("no standing after %d canaries matched", StandingAfter)
	}
	var caught []PeerCaught
	for i := range 2 {
		g := leaseOf(t, m, liar, "203.0.113.0/24", int64(10+i), 1)
		r := applyEncoded(t, m, ReportResult{Peer: liar, Job: g[0].Job, Shard: g[0].Shard, Result: result("lie"), Now: int64(10 + i)})
		for _, e := range r.Events {
			if c, ok := e.(PeerCaught); ok {
				caught = append(caught, c)
			}
		}
	}
	if len(caught) != 2 || !caught[1].Excluded {
		t.Fatalf("a liar on two canaries: %+v, want caught twice and excluded", caught)
	}
}
