package identity

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"testing"
)

// RFC 8032 §7.2, the Ed25519ctx vector with context "foo": Sign is
// Ed25519ctx with the purpose as context.
func TestSignEd25519ctxVector(t *testing.T) {
	var seed [32]byte
	hex.Decode(seed[:], []byte("0305334e381af78f141cb666f6199f57bc3495335a256a95bd2a55bf546663f6"))
	pub, _ := hex.DecodeString("dfc9425e4f968f7f0c29f0259cf5f9aed6851c2bb4ad8bfb860cfee0ab248292")
	msg, _ := hex.DecodeString("f726936d19c800494e3fdaff20b276a8")
	want, _ := hex.DecodeString("55a4cc2f70a54e04288c5f4cd1e45a7bb520b36292911876cada7323198dd87a8b36950b95130022907a7fb7c4e9b2d5f6cca685a587b4b21f4b888e4e7edb0d")
	id := NewFromSeed(seed)
	if !bytes.Equal(id.Public().Ed25519(), pub) {
		t.Fatal("public key does not match the vector")
	}
	sig := Sign(id, "foo", msg)
	if !bytes.Equal(sig, want) {
		t.Fatalf("signature %x does not match the vector", sig)
	}
	if !Verify(id.Public(), "foo", msg, sig) {
		t.Fatal("vector signature rejected")
	}
}

func TestSignaturesAreBoundToPurpose(t *testing.T) {
	id, other := seeded(1), seeded(2)
	msg := []byte("receipt 7")
	sig := Sign(id, PurposeReceipt, msg)
	if !Verify(id.Public(), PurposeReceipt, msg, sig) {
		t.Fatal("valid signature rejected")
	}
	for name, ok := range map[string]bool{
		"other purpose": Verify(id.Public(), PurposeLedgerEntry, msg, sig),
		"other key":     Verify(other.Public(), PurposeReceipt, msg, sig),
		"other message": Verify(id.Public(), PurposeReceipt, []byte("receipt 8"), sig),
		"short sig":     Verify(id.Public(), PurposeReceipt, msg, sig[:63]),
		"empty purpose": Verify(id.Public(), "", msg, sig),
		"pure Ed25519":  ed25519.Verify(id.Public().Ed25519(), msg, sig),
		"tampered sig":  Verify(id.Public(), PurposeReceipt, msg, append(append([]byte(nil), sig[:63]...), sig[63]^1)),
	} {
		if ok {
			t.Errorf("%s: signature verified", name)
		}
	}
	// And a pure Ed25519 signature (as made in a TLS handshake) is no
	// signature for any purpose.
	pure := ed25519.Sign(id.PrivateKey(), msg)
	if Verify(id.Public(), PurposeReceipt, msg, pure) {
		t.Fatal("pure Ed25519 signature verified as a receipt signature")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Sign with an empty purpose did not panic")
		}
	}()
	Sign(id, "", msg)
}

func TestSignValue(t *testing.T) {
	id := seeded(1)
	type receipt struct {
		Seq   uint64 `cbor:"seq"`
		Shard string `cbor:"shard"`
	}
	r := receipt{Seq: 3, Shard: "s"}
	sig, err := SignValue(id, PurposeReceipt, r)
	if err != nil {
		t.Fatal(err)
	}
	if !VerifyValue(id.Public(), PurposeReceipt, r, sig) {
		t.Fatal("value signature rejected")
	}
	// Equal values encode equally, so a map of the same fields verifies too.
	if !VerifyValue(id.Public(), PurposeReceipt, map[string]any{"shard": "s", "seq": uint64(3)}, sig) {
		t.Fatal("canonical encoding differs between struct and map")
	}
	r.Seq = 4
	if VerifyValue(id.Public(), PurposeReceipt, r, sig) {
		t.Fatal("changed value verified")
	}
	if VerifyValue(id.Public(), PurposeReceipt, make(chan int), sig) {
		t.Fatal("unencodable value verified")
	}
}
