package coordinator

import (
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// A browser volunteer (a peer named after its own key, receipt.VolunteerPeer)
// leases open jobs only, never a consortium job, a training round's or a
// job that reads input tables; its
// report must be signed by the key its name was derived from (SC7305
// otherwise); the receipt credits it and verifies offline with a key
// lookup that knows only the members.
func TestVolunteerPeers(t *testing.T) {
	vol := identity.NewFromSeed([32]byte{42})
	mallory := identity.NewFromSeed([32]byte{43})
	w1 := identity.NewFromSeed([32]byte{44})
	name := receipt.VolunteerPeer(vol.Public().String())
	if !receipt.IsVolunteer(name) || receipt.IsVolunteer("w1") || receipt.VolunteerKey(name, mallory.Public().String()) {
		t.Fatalf("volunteer names: %q", name)
	}
	shards := []ShardPlan{{Index: 0, ID: content.Hash([]byte("s0")), Price: 2, PriceBasis: "flat"}}

	// A consortium pool: the worker gets the shard, the volunteer nothing.
	cm, _ := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 1000, SignedReports: true})
	cjob := content.Hash([]byte("consortium"))
	applyEncoded(t, cm, SubmitJob{Job: cjob, Name: "c", Bundle: content.Hash([]byte("b")), Submitter: "alice", Shards: shards, Now: 1})
	if g := applyEncoded(t, cm, Lease{Peer: name, Now: 2, Max: 4}).Response.(*LeaseResponse).Grants; len(g) != 0 {
		t.Fatalf("a volunteer got %d grants in a consortium pool", len(g))
	}
	if g := applyEncoded(t, cm, Lease{Peer: "w1", Now: 2, Max: 4}).Response.(*LeaseResponse).Grants; len(g) != 1 {
		t.Fatalf("a worker got %d grants", len(g))
	}

	// An open pool: a training round's job gives the volunteer nothing;
	// an ordinary job's shard it leases, and reports signed.
	om, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: 1000, SignedReports: true})
	round := content.Hash([]byte("round"))
	applyEncoded(t, om, SubmitJob{Job: round, Name: "r", Run: content.Hash([]byte("run")), Round: 1, Bundle: content.Hash([]byte("b")), Submitter: "alice",
		Policy: Policy{Replicas: 2}, Shards: shards, Now: 1})
	// A job that reads (public) input tables: a tab has no folder for
	// them, so it is never leased one of its shards.
	tables := content.Hash([]byte("tables"))
	applyEncoded(t, om, SubmitJob{Job: tables, Name: "t", Bundle: content.Hash([]byte("bt")), Submitter: "alice", Policy: Policy{Replicas: 2},
		Inputs: []trust.Item{{Name: "points", Class: trust.Public}}, Shards: shards, Now: 1})
	if js, _ := om.Job(tables); !js.ReadsInputs {
		t.Fatalf("a job with inputs does not say so: %+v", js)
	}
	if n := om.Leasable(name, 2); n != 0 {
		t.Fatalf("a volunteer could lease %d shards of a job with inputs", n)
	}
	if n := om.Leasable("w1", 2); n != 1 {
		t.Fatalf("a worker could lease %d shards of the job with inputs, want 1", n)
	}
	job := content.Hash([]byte("open"))
	applyEncoded(t, om, SubmitJob{Job: job, Name: "o", Bundle: content.Hash([]byte("b")), Submitter: "alice", Policy: Policy{Replicas: 2}, Shards: shards, Now: 1})
	g := applyEncoded(t, om, Lease{Peer: name, Now: 2, Max: 4}).Response.(*LeaseResponse).Grants
	if len(g) != 1 || g[0].Job != job {
		t.Fatalf("volunteer grants in an open pool: %+v (want only the job that is no round and reads no inputs)", g)
	}
	res := content.Hash([]byte("result"))
	report := func(peer string, signer *identity.Identity) ReportResult {
		st := StatementOf(job, 0, res, Policy{Replicas: 2}, peer)
		return ReportResult{Peer: peer, Job: job, Shard: 0, Result: res, Key: signer.Public().String(), Sig: identity.Sign(signer, identity.PurposeResult, st.Bytes()), Now: 3}
	}
	wantCode(t, applyEncoded(t, om, report(name, mallory)), diag.VerifyBadSignature)
	if r := applyEncoded(t, om, report(name, vol)); r.Refused() {
		t.Fatal(r.Refusal)
	}
	applyEncoded(t, om, Lease{Peer: "w1", Now: 3, Max: 1, Job: job})
	if r := applyEncoded(t, om, report("w1", w1)); r.Refused() {
		t.Fatal(r.Refusal)
	}
	rs := om.Receipts(0)
	if len(rs) != 1 || len(rs[0].Peers) != 2 {
		t.Fatalf("receipts: %+v", rs)
	}
	members := func(p string) (string, bool) {
		if p == "w1" {
			return w1.Public().String(), true
		}
		return "", false
	}
	if err := rs[0].VerifySignatures(members); err != nil {
		t.Fatalf("the receipt crediting a volunteer does not verify: %v", err)
	}
}

// A volunteer holds at most Lease.Hold live leases at once (the default
// without one): a lease asking for more is clipped to the room left, one
// at the cap is refused with SC7510, and a lease handed back or expired
// makes room again. A member asking for many is not capped.
func TestVolunteerLeaseCap(t *testing.T) {
	name := receipt.VolunteerPeer(identity.NewFromSeed([32]byte{45}).Public().String())
	m, job := openJob(t, 20, 1000)
	grants := func(r Result) []LeaseGrant {
		t.Helper()
		if r.Refused() {
			t.Fatal(r.Refusal)
		}
		return r.Response.(*LeaseResponse).Grants
	}
	if g := grants(applyEncoded(t, m, Lease{Peer: name, Now: 2, Max: 2, Hold: 3})); len(g) != 2 {
		t.Fatalf("first lease: %d grants, want 2", len(g))
	}
	if g := grants(applyEncoded(t, m, Lease{Peer: name, Now: 2, Max: 5, Hold: 3})); len(g) != 1 {
		t.Fatalf("a lease past the cap got %d grants, want it clipped to 1", len(g))
	}
	r := applyEncoded(t, m, Lease{Peer: name, Now: 3, Max: 1, Hold: 3})
	wantCode(t, r, diag.VolunteerLeaseCap)
	if !strings.Contains(r.Refusal[0].Message, "3 live leases") || r.Refusal[0].Help == "" {
		t.Errorf("the refusal says too little: %+v", r.Refusal[0])
	}
	wantCode(t, applyEncoded(t, m, Lease{Peer: name, Now: 3, Hold: MaxVolunteerLeases + 1}), diag.PoolBadCommand)
	// Handing one back makes room for one.
	applyEncoded(t, m, ReleaseLeases{Peer: name, Now: 4, Shards: []ShardRef{{Job: job, Shard: 0}}})
	if g := grants(applyEncoded(t, m, Lease{Peer: name, Now: 4, Max: 4, Hold: 3})); len(g) != 1 {
		t.Fatalf("after a release: %d grants, want 1", len(g))
	}
	// Once they all expire (TTL 1000), the default cap applies.
	if g := grants(applyEncoded(t, m, Lease{Peer: name, Now: 2000, Max: 64})); len(g) != DefaultVolunteerLeases {
		t.Fatalf("after expiry, without Hold: %d grants, want %d", len(g), DefaultVolunteerLeases)
	}
	if g := grants(applyEncoded(t, m, Lease{Peer: "w1", Now: 2000, Max: 20, Hold: 1})); len(g) != 20 {
		t.Fatalf("a member got %d grants, want all 20 (no cap)", len(g))
	}
}

// The reviewer's attack: one person, two volunteer keys (two cheap joins)
// from one network, in an open pool. Before Lease.Origin both keys leased
// both replicas of every shard and their agreeing wrong result verified
// all 4 of 4 shards. Now the second key of the origin gets no shard the
// first holds or answered, nothing is decided by the two alone, and a
// volunteer from another network gets the second replica: its honest
// result disagrees, so the wrong one is never verified.
func TestSameOriginVolunteersNeverAnswerOneShard(t *testing.T) {
	vol := func(seed byte) string {
		return receipt.VolunteerPeer(identity.NewFromSeed([32]byte{seed}).Public().String())
	}
	a, b, honest := vol(61), vol(62), vol(63)
	m, job := openJob(t, 4, 60000)
	wrong, right := content.Hash([]byte("wrong")), content.Hash([]byte("right"))
	lease := func(peer, origin string, now int64) []LeaseGrant {
		t.Helper()
		r := applyEncoded(t, m, Lease{Peer: peer, Now: now, Max: 8, Origin: origin})
		if r.Refused() {
			t.Fatal(r.Refusal)
		}
		return r.Response.(*LeaseResponse).Grants
	}
	report := func(peer string, g []LeaseGrant, res content.Ref, now int64) {
		t.Helper()
		for _, g := range g {
			if r := applyEncoded(t, m, ReportResult{Peer: peer, Job: g.Job, Shard: g.Shard, Result: res, Now: now}); r.Refused() {
				t.Fatal(r.Refusal)
			}
		}
	}
	ga := lease(a, "198.51.100.0/24", 2)
	if len(ga) != 4 {
		t.Fatalf("the first key got %d shards, want 4", len(ga))
	}
	if gb := lease(b, "198.51.100.0/24", 3); len(gb) != 0 {
		t.Fatalf("the second key of the same network got %d shards the first holds", len(gb))
	}
	report(a, ga, wrong, 4)
	if gb := lease(b, "198.51.100.0/24", 5); len(gb) != 0 {
		t.Fatalf("the second key of the same network got %d shards the first answered", len(gb))
	}
	earnStanding(m, honest) // a fresh key would not get shards a fresh key answered (standing.go)
	gh := lease(honest, "203.0.113.0/24", 6)
	if len(gh) != 4 {
		t.Fatalf("a volunteer of another network got %d shards, want 4", len(gh))
	}
	report(honest, gh, right, 7)
	st, err := m.Job(job)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Shards {
		if s.State == StateVerified && s.Result == wrong {
			t.Errorf("shard %d verified with the colluders' wrong result", s.Index)
		}
	}
	// Nor the tie-break replica the disagreement opened: its network
	// answered every shard already.
	if gb := lease(b, "198.51.100.0/24", 8); len(gb) != 0 {
		t.Fatalf("the second key got %d shards its network's first key answered", len(gb))
	}
}

// openJob is an open pool running one job of n flat-priced shards, two
// replicas each, with leases of ttl ms.
func openJob(t *testing.T, n int, ttl int64) (*Machine, content.Ref) {
	var shards []ShardPlan
	for i := range n {
		shards = append(shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i)}), Price: 1, PriceBasis: "flat"})
	}
	m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: ttl})
	job := content.Hash([]byte("open"))
	applyEncoded(t, m, SubmitJob{Job: job, Name: "o", Bundle: content.Hash([]byte("b")), Submitter: "alice", Policy: Policy{Replicas: 2}, Shards: shards, Now: 1})
	return m, job
}

// With a seed (the submitting node's secret), two volunteer keys of
// different networks asking in turn are not offered the same shards:
// before, shards went out in index order, so the second key took the
// second replica of exactly the 8 shards the first held. A member still
// gets index order, and so does a job without a seed.
func TestVolunteerOrderUnpredictable(t *testing.T) {
	vol := func(seed byte) string {
		return receipt.VolunteerPeer(identity.NewFromSeed([32]byte{seed}).Public().String())
	}
	var shards []ShardPlan
	for i := range 256 {
		shards = append(shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i), 1}), Price: 1, PriceBasis: "flat"})
	}
	leased := func(peer, origin string, m *Machine) map[int]bool {
		t.Helper()
		r := applyEncoded(t, m, Lease{Peer: peer, Now: 2, Max: 8, Origin: origin})
		if r.Refused() {
			t.Fatal(r.Refusal)
		}
		out := map[int]bool{}
		for _, g := range r.Response.(*LeaseResponse).Grants {
			out[g.Shard] = true
		}
		return out
	}
	overlap := func(seed string) (int, map[int]bool) {
		m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: 60000})
		applyEncoded(t, m, SubmitJob{Job: content.Hash([]byte("o")), Name: "o", Bundle: content.Hash([]byte("b")), Submitter: "alice",
			Policy: Policy{Replicas: 2}, Shards: shards, Seed: seed, Now: 1})
		a := leased(vol(81), "198.51.100.0/24", m)
		earnStanding(m, vol(82)) // else it gets no shard the fresh first key holds
		b := leased(vol(82), "203.0.113.0/24", m)
		n := 0
		for s := range b {
			if a[s] {
				n++
			}
		}
		return n, leased("w1", "", m)
	}
	if n, _ := overlap(""); n != 8 {
		t.Fatalf("without a seed the two keys share %d of 8 shards, want 8 (index order)", n)
	}
	if n, w := overlap("5d1c0a7e93b24f68a0e1c2d3b4a59687"); n > 2 || !w[0] || !w[7] {
		t.Errorf("with a seed the two keys share %d of 8 shards (want ≤ 2); the member got %v (want index order from 0)", n, w)
	}
	wantCode(t, applyEncoded(t, mustNew(t), SubmitJob{Job: content.Hash([]byte("x")), Name: "x", Bundle: content.Hash([]byte("b")),
		Policy: Policy{Replicas: 2}, Shards: shards[:1], Seed: strings.Repeat("a", MaxSeed+1), Now: 1}), diag.PoolBadCommand)
}

func mustNew(t *testing.T) *Machine {
	m, err := New(Config{Regime: trust.Open, DefaultLeaseTTL: 60000})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The volunteer order is a permutation of the undecided shards for every
// size (each shard looked at once), and not a rotation of index order: the
// shards a key got do not tell it which come next.
func TestShuffleIsAPermutation(t *testing.T) {
	key := make([]byte, 32)
	for n := uint64(1); n <= 300; n++ {
		p := newShuffle(key, n)
		seen := make([]bool, n)
		rotation := true
		for k := range n {
			v := p.at(k)
			if v >= n || seen[v] {
				t.Fatalf("n=%d: position %d gives %d (seen or out of range)", n, k, v)
			}
			seen[v] = true
			if k > 0 && v != (p.at(k-1)+1)%n {
				rotation = false
			}
		}
		if n >= 8 && rotation {
			t.Fatalf("n=%d: the order is a rotation of index order", n)
		}
	}
}
