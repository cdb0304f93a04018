package aggregator

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/secagg"
)

// A checker takes a site's forwarded masked input once: the same bytes
// again (a forward retried after its answer was lost) are taken as done
// and not summed twice; other bytes for the same site are refused.
func TestShadowSumTakesARetriedForwardOnce(t *testing.T) {
	p := secagg.Params{Round: "shadow", Dim: 4, Clip: 1, PRG: secagg.DefaultPRG()}
	for _, id := range []string{"s1", "s2", "s3"} {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		p.Members = append(p.Members, secagg.Member{ID: id, Key: pub})
	}
	acc, err := secagg.NewAccumulator(p)
	if err != nil {
		t.Fatal(err)
	}
	size := len(sumBytes(acc.Sum()))
	sh := &shadowSum{acc: acc, hashes: map[string]content.Ref{}}
	one := &secagg.MaskedInput{Round: p.Round, From: "s1", Masked: make([]byte, size)}
	one.Masked[0] = 7
	if err := sh.add("s1", one, content.Hash(one.Masked)); err != nil {
		t.Fatal(err)
	}
	if err := sh.add("s1", one, content.Hash(one.Masked)); err != nil {
		t.Fatalf("the same input forwarded again: %v", err)
	}
	if sum, in := acc.Sum(); sum[0] != 7 || len(in) != 1 {
		t.Fatalf("after a retried forward the sum starts %d over %d inputs, want 7 over 1", sum[0], len(in))
	}
	other := &secagg.MaskedInput{Round: p.Round, From: "s1", Masked: make([]byte, size)}
	if err := sh.add("s1", other, content.Hash(other.Masked)); err == nil {
		t.Fatal("a second, different input of s1 was taken")
	}
}

// sumBytes is the sum of an Accumulator.Sum.
func sumBytes(b []byte, _ map[string]bool) []byte { return b }
