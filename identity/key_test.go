package identity

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

func seeded(b byte) *Identity {
	var seed [32]byte
	seed[0] = b
	return NewFromSeed(seed)
}

func TestPublicKeyRoundTrip(t *testing.T) {
	id, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	s := id.Public().String()
	if !strings.HasPrefix(s, "ed25519:") || len(s) != len("ed25519:")+44 {
		t.Fatalf("text form %q", s)
	}
	k, err := ParsePublicKey(s)
	if err != nil {
		t.Fatal(err)
	}
	if !k.Equal(id.Public()) {
		t.Fatal("round trip changed the key")
	}
	if k.Equal(seeded(1).Public()) {
		t.Fatal("different keys compare equal")
	}
	b, _ := json.Marshal(struct{ K PublicKey }{k})
	var back struct{ K PublicKey }
	if err := json.Unmarshal(b, &back); err != nil || !back.K.Equal(k) {
		t.Fatalf("JSON round trip: %s %v", b, err)
	}
}

func TestParsePublicKeyRefuses(t *testing.T) {
	good := seeded(1).Public().String()
	body := strings.TrimPrefix(good, "ed25519:")
	for _, s := range []string{
		"",
		body,                         // no prefix
		"ssh-ed25519:" + body,        // wrong prefix
		"ed25519:" + body[:40],       // truncated
		"ed25519:" + body + "AAAA",   // too long
		"ed25519:" + body[:43] + "!", // not base64
		"ed25519:" + strings.TrimRight(body, "="), // unpadded: not canonical
		"ed25519:" + body[:42] + "B=",             // non-zero trailing bits: not canonical
		" " + good,
		good + "\n",
	} {
		_, err := ParsePublicKey(s)
		ds, ok := diag.As(err)
		if !ok || ds[0].Code != diag.PublicKeyMalformed {
			t.Errorf("ParsePublicKey(%q) = %v, want SC1102", s, err)
		}
	}
}

func TestIdentityPrintsNoPrivateKey(t *testing.T) {
	var seed [32]byte
	rand.Read(seed[:])
	id := NewFromSeed(seed)
	priv := fmt.Sprintf("%x", []byte(id.PrivateKey()))
	seedHex := priv[:64]
	//lint:ignore SA9005 the point is that marshalling an Identity leaks nothing
	b, _ := json.Marshal(id)
	for _, out := range []string{
		fmt.Sprint(id), fmt.Sprintf("%v", id), fmt.Sprintf("%+v", id), fmt.Sprintf("%#v", id),
		fmt.Sprintf("%v", *id), fmt.Sprintf("%+v", *id), string(b),
	} {
		if strings.Contains(out, seedHex) || strings.Contains(out, strings.Trim(fmt.Sprint([]byte(id.PrivateKey())[:8]), "[]")) {
			t.Fatalf("printing an identity leaked its private key: %s", out)
		}
	}
}
