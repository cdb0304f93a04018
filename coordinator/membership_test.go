package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Membership changes through the machine: seeded from the first change's
// Base, decided by the rules (unique names and keys, retired keys never
// back, the last operator and aggregator stay, Seq in order), a revoked
// member's live leases revoked and its later lease requests refused, and
// all of it in the snapshot and the state hash, replayed identically.
func TestMembershipChanges(t *testing.T) {
	m, _ := busy(t) // w3 and w4 hold live leases on j1
	base := []MemberEntry{
		{Name: "agg", Role: "aggregator", PublicKey: "k-agg", Address: "a:1", RaftAddress: "a:2"},
		{Name: "ops", Role: "operator", PublicKey: "k-ops"},
		{Name: "w3", Role: "worker", PublicKey: "k-w3"},
		{Name: "w4", Role: "worker", PublicKey: "k-w4"},
	}
	change := func(seq int, op string, e MemberEntry) ChangeMembership {
		return ChangeMembership{Base: base, Seq: seq, Op: op, Member: e, Operator: "ops", Signed: []byte{byte(seq), 1}, Now: 50}
	}
	steps := []struct {
		c    ChangeMembership
		code diag.Code // "" when accepted
	}{
		{ChangeMembership{Seq: 0, Op: "add", Member: MemberEntry{Name: "x", Role: "worker", PublicKey: "k-x"}, Operator: "ops", Signed: []byte{1}, Now: 50}, diag.PoolBadCommand}, // no base to seed from
		{change(0, "add", MemberEntry{Name: "w9", Role: "worker", PublicKey: "k-ops"}), diag.MembershipDuplicate},
		{change(0, "add", MemberEntry{Name: "w3", Role: "worker", PublicKey: "k-new"}), diag.MembershipDuplicate},
		{change(0, "add", MemberEntry{Name: "w9", Role: "silo", PublicKey: "k-w9", Address: "a:1"}), diag.MembershipDuplicate},
		{change(0, "revoke", MemberEntry{Name: "w33"}), diag.MembershipUnknown},
		{change(0, "revoke", MemberEntry{Name: "ops"}), diag.MembershipLastOperator},
		{change(0, "revoke", MemberEntry{Name: "agg"}), diag.MembershipQuorum},
		{change(1, "add", MemberEntry{Name: "w9", Role: "worker", PublicKey: "k-w9"}), diag.MembershipStale},
		{ChangeMembership{Base: base, Seq: 0, Op: "add", Member: MemberEntry{Name: "w9", Role: "worker", PublicKey: "k-w9"}, Operator: "w3", Signed: []byte{1}, Now: 50}, diag.MembershipSignature},
		{change(0, "add", MemberEntry{Name: "w9", Role: "worker", PublicKey: "k-w9"}), ""},
		{change(1, "revoke", MemberEntry{Name: "w3"}), ""},
		{change(2, "rotate", MemberEntry{Name: "w4", PublicKey: "k-w4b"}), ""},
		{change(3, "add", MemberEntry{Name: "w5", Role: "worker", PublicKey: "k-w3"}), diag.MembershipDuplicate}, // revoked key
		{change(3, "rotate", MemberEntry{Name: "w9", PublicKey: "k-w4"}), diag.MembershipDuplicate},              // rotated-away key
	}
	for i, s := range steps {
		before := m.StateHash()
		r := m.Apply(s.c)
		switch {
		case s.code == "" && r.Refused():
			t.Fatalf("step %d (%s %s): refused: %v", i, s.c.Op, s.c.Member.Name, r.Refusal)
		case s.code != "" && (!r.Refused() || r.Refusal[0].Code != s.code):
			t.Fatalf("step %d (%s %s): %v, want %s", i, s.c.Op, s.c.Member.Name, r.Refusal, s.code)
		case s.code != "" && m.StateHash() != before:
			t.Fatalf("step %d: a refused change changed the state", i)
		}
		if s.c.Op == "revoke" && s.code == "" {
			resp := r.Response.(*MembershipResponse)
			if len(resp.LeasesRevoked) == 0 {
				t.Fatalf("revoking w3 revoked none of its leases: %+v", resp)
			}
		}
	}
	if got := m.Leases("w3"); len(got) != 0 {
		t.Fatalf("w3 still holds leases: %v", got)
	}
	if r := m.Apply(Lease{Peer: "w3", Now: 51}); !r.Refused() || r.Refusal[0].Code != diag.MemberRefused {
		t.Fatalf("a revoked peer's lease request: %v", r.Refusal)
	}
	members, changes, seeded := m.Membership()
	if !seeded || len(changes) != 3 || len(members) != 4 {
		t.Fatalf("membership: %v, %d changes", members, len(changes))
	}
	// Snapshot, restore and replay agree.
	r, err := Load(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if r.StateHash() != m.StateHash() {
		t.Fatal("restore changed the state hash")
	}
	next := change(3, "add", MemberEntry{Name: "w7", Role: "worker", PublicKey: "k-w7"})
	a, b := m.Apply(next), r.Apply(next)
	if a.Refused() || b.Refused() || m.StateHash() != r.StateHash() {
		t.Fatalf("original and restored machine differ after a change: %v %v", a.Refusal, b.Refusal)
	}
	// The command survives its canonical encoding.
	enc, err := EncodeCommand(next)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := DecodeCommand(enc)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := EncodeCommand(dec); content.Hash(again) != content.Hash(enc) {
		t.Fatal("ChangeMembership does not round-trip")
	}
}
