package proof

import (
	"crypto/ed25519"
	"testing"
)

func TestSolveChecks(t *testing.T) {
	n := Solve("c1", "ed25519:k", 10)
	if !Check("c1", "ed25519:k", n, 10) {
		t.Fatal("a solved nonce does not check")
	}
	// Bound to its challenge and key: with 10 bits, another pair accepts
	// it with chance 1/1024; these two were checked not to.
	if Check("c2", "ed25519:k", n, 10) && Check("c1", "ed25519:j", n, 10) {
		t.Fatal("a proof transfers to another challenge and key")
	}
	if Check("c1", "ed25519:k", n, MaxBits+1) {
		t.Fatal("a difficulty past MaxBits checks")
	}
	pub, priv, _ := ed25519.GenerateKey(nil)
	sig, err := priv.Sign(nil, JoinMessage("c1", "k"), &ed25519.Options{Context: PurposeJoin})
	if err != nil {
		t.Fatal(err)
	}
	if !VerifyJoin(pub, "c1", "k", sig) || VerifyJoin(pub, "c2", "k", sig) {
		t.Fatal("join signature")
	}
}
