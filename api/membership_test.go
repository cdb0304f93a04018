package api

import (
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// TestCheckChange: what POST /v1/federation/changes refuses before it
// proposes a change, besides its signature (identity.Federation.Verify)
// and its place in the order (the coordinator refuses a stale Seq):
// bad names, roles, keys and addresses, and fields an operation does not
// apply — a signed change means exactly what it changes.
func TestCheckChange(t *testing.T) {
	const refused diag.Code = "refused"
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	key := id.Public().String()
	for _, tc := range []struct {
		name string
		c    identity.Change
		want diag.Code // "" accepted; refused: any code
	}{
		{"add a silo", identity.Change{Op: identity.OpAdd, Name: "lab-2", Role: identity.Silo, PublicKey: key}, ""},
		{"add an aggregator", identity.Change{Op: identity.OpAdd, Name: "agg-4", Role: identity.Aggregator, PublicKey: key, Address: "10.0.0.4:7400", RaftAddress: "10.0.0.4:7401"}, ""},
		{"rotate", identity.Change{Op: identity.OpRotate, Name: "lab-2", PublicKey: key}, ""},
		{"revoke", identity.Change{Op: identity.OpRevoke, Name: "lab-2"}, ""},
		{"unknown operation", identity.Change{Op: "promote", Name: "lab-2"}, diag.PoolBadRequest},
		{"bad name", identity.Change{Op: identity.OpRevoke, Name: "../etc"}, refused},
		{"unknown role", identity.Change{Op: identity.OpAdd, Name: "lab-2", Role: "root", PublicKey: key}, refused},
		{"bad key", identity.Change{Op: identity.OpAdd, Name: "lab-2", Role: identity.Silo, PublicKey: "ed25519:AAAA"}, refused},
		{"aggregator without addresses", identity.Change{Op: identity.OpAdd, Name: "agg-4", Role: identity.Aggregator, PublicKey: key}, diag.MemberAddress},
		{"a person with an address", identity.Change{Op: identity.OpAdd, Name: "bob", Role: identity.Researcher, PublicKey: key, Address: "10.0.0.9:1"}, diag.MemberAddress},
		{"a revocation carrying a key", identity.Change{Op: identity.OpRevoke, Name: "lab-2", PublicKey: key}, diag.PoolBadRequest},
		{"a revocation carrying a role", identity.Change{Op: identity.OpRevoke, Name: "lab-2", Role: identity.Operator}, diag.PoolBadRequest},
		{"a rotation carrying an address", identity.Change{Op: identity.OpRotate, Name: "lab-2", PublicKey: key, Address: "10.0.0.9:1"}, diag.PoolBadRequest},
		{"a rotation carrying a role", identity.Change{Op: identity.OpRotate, Name: "lab-2", PublicKey: key, Role: identity.Operator}, diag.PoolBadRequest},
	} {
		ds := CheckChange(tc.c)
		switch {
		case tc.want == "" && len(ds) > 0:
			t.Errorf("%s: refused: %v", tc.name, ds)
		case tc.want == refused && len(ds) == 0:
			t.Errorf("%s: accepted", tc.name)
		case tc.want != "" && tc.want != refused && (len(ds) == 0 || ds[0].Code != tc.want):
			t.Errorf("%s: got %v, want %s", tc.name, ds, tc.want)
		}
	}
}
