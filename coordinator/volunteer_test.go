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
	var shards []ShardPlan
	for i := range 20 {
		shards = append(shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i)}), Price: 1, PriceBasis: "flat"})
	}
	m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: 1000})
	job := content.Hash([]byte("open"))
	applyEncoded(t, m, SubmitJob{Job: job, Name: "o", Bundle: content.Hash([]byte("b")), Submitter: "alice", Policy: Policy{Replicas: 2}, Shards: shards, Now: 1})
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
