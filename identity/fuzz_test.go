package identity

import (
	"fmt"
	"testing"
)

// A public key has one text form: parse then print gives the same string.
func FuzzParsePublicKey(f *testing.F) {
	f.Add(seeded(1).Public().String())
	f.Add("ed25519:")
	f.Add("ed25519:AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParsePublicKey(s)
		if err != nil {
			return
		}
		if k.String() != s {
			t.Fatalf("parsed %q, prints %q", s, k.String())
		}
	})
}

// The federation parser never panics, and what it accepts is consistent.
func FuzzParseFederation(f *testing.F) {
	seeds := []string{fmt.Sprintf(goodFederation, keys(3)...), "", "members: [", "federation: a\nregime: own\nmembers: [{name: a}]\n"}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		fed, err := ParseFederation("f.yaml", []byte(src))
		if err != nil {
			return
		}
		if len(fed.ByRole(Aggregator)) == 0 {
			t.Fatal("accepted a federation without an aggregator")
		}
		for _, m := range fed.Members {
			if got, ok := fed.Lookup(m.PublicKey); !ok || got.Name != m.Name {
				t.Fatalf("member %q not found by its key", m.Name)
			}
		}
	})
}
