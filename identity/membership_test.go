package identity

import (
	"crypto/tls"
	"fmt"
	"net"
	"testing"

	"github.com/scellis/scellis/diag"
)

// A member follows signed changes: each verifies against the membership
// before it (so a revoked operator's later signature is refused), applies
// once and in order, and a TLS config built before a change follows it.
func TestApplyChanges(t *testing.T) {
	fed, err := ParseFederation("f.yaml", []byte(fmt.Sprintf(`federation: f
regime: own
members:
  - {name: agg-1, role: aggregator, public_key: %s, address: "127.0.0.1:1", raft_address: "127.0.0.1:2"}
  - {name: ops, role: operator, public_key: %s}
  - {name: ops2, role: operator, public_key: %s}
`, seeded(1).Public(), seeded(2).Public(), seeded(3).Public())))
	if err != nil {
		t.Fatal(err)
	}
	agg, ops, ops2, w, w2 := seeded(1), seeded(2), seeded(3), seeded(4), seeded(5)
	sign := func(by *Identity, c Change) SignedChange {
		c.Federation = "f"
		sc, err := SignChange(by, c)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	srv, err := ServerTLSConfig(agg, fed)
	if err != nil {
		t.Fatal(err)
	}
	addW := sign(ops, Change{Seq: 0, Op: OpAdd, Name: "w", Role: Worker, PublicKey: w.Public().String(), Operator: "ops"})
	revokeOps := sign(ops2, Change{Seq: 1, Op: OpRevoke, Name: "ops", Operator: "ops2"})
	byRevoked := sign(ops, Change{Seq: 2, Op: OpRotate, Name: "w", PublicKey: w2.Public().String(), Operator: "ops"})

	if n, err := fed.ApplyChanges([]SignedChange{revokeOps}); n != 0 || err == nil {
		t.Fatalf("a change out of order applied: %d %v", n, err)
	}
	forged := addW
	forged.Change.Name = "mallory"
	if _, err := fed.ApplyChanges([]SignedChange{forged}); !isCode(err, diag.MembershipSignature) {
		t.Fatalf("a forged change: %v", err)
	}
	if n, err := fed.ApplyChanges([]SignedChange{addW, revokeOps, addW}); n != 2 || err != nil {
		t.Fatalf("applied %d: %v", n, err)
	}
	if _, err := fed.ApplyChanges([]SignedChange{byRevoked}); !isCode(err, diag.MembershipSignature) {
		t.Fatalf("a revoked operator's change: %v", err)
	}
	if m, ok := fed.Lookup(w.Public()); !ok || m.Name != "w" || fed.Applied() != 2 {
		t.Fatalf("w not a member after its addition: %v", m)
	}
	if _, ok := fed.Member("ops"); ok {
		t.Fatal("ops still a member after its revocation")
	}
	// The server config made before the changes follows them.
	handshake := func(id *Identity, f *Federation) error {
		cli, err := ClientTLSConfig(id, f, "agg-1", Aggregator)
		if err != nil {
			return err
		}
		return pipeHandshake(srv, cli)
	}
	if err := handshake(w, fed); err != nil {
		t.Fatalf("an added member is refused: %v", err)
	}
	old := fed.With(Member{Name: "ops", Role: Operator, PublicKey: ops.Public()})
	if err := handshake(ops, old); err == nil {
		t.Fatal("a revoked member completed a handshake")
	}
}

func isCode(err error, code diag.Code) bool {
	ds, ok := diag.As(err)
	return ok && ds[0].Code == code
}

// pipeHandshake runs a TLS handshake between server and client configs
// over an in-memory pipe and returns the server's error.
func pipeHandshake(srv, cli *tls.Config) error {
	a, b := net.Pipe()
	errc := make(chan error, 1)
	go func() {
		c := tls.Client(b, cli)
		errc <- c.Handshake()
		// The client sees the server's verdict on its first read.
		c.Read(make([]byte, 1))
		c.Close()
	}()
	s := tls.Server(a, srv)
	err := s.Handshake()
	s.Close()
	<-errc
	return err
}
