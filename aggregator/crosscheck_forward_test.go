package aggregator

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// A checker takes a site's forwarded masked input once: the same bytes
// again (a forward retried after its answer was lost) are taken as done
// and not summed twice; other bytes for the same site are refused.
func TestShadowSumTakesARetriedForwardOnce(t *testing.T) {
	p := threeSiteParams(t, "shadow")
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

// A checker keeps one round's sum per run (a newer round's first forward
// drops the older one's) and makes none for a round the leader would not
// record: a compromised leader cannot fill its memory with sums.
func TestShadowSumsAreBounded(t *testing.T) {
	p := threeSiteParams(t, "bounded")
	runA, runB := content.Hash([]byte("run a")), content.Hash([]byte("run b"))
	r1, r2, rb := content.Hash([]byte("a round 1")), content.Hash([]byte("a round 2")), content.Hash([]byte("b round 1"))
	var s shadowSums
	b := &fl.RoundBundle{SecAgg: p}
	for _, o := range []struct{ run, ref content.Ref }{{runA, r1}, {runB, rb}, {runA, r2}} {
		if _, err := s.open(o.run, o.ref, b); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.m[r1]; ok || len(s.m) != 2 {
		t.Fatalf("after run a's second round: %d sums held, its first held %v; want run a's second and run b's", len(s.m), ok)
	}
	huge := *b
	huge.SecAgg.Dim = crossCheckMaxTranscript / 8
	if _, err := s.open(runB, content.Hash([]byte("huge")), &huge); err == nil {
		t.Fatal("a sum was made for a round over crossCheckMaxTranscript")
	}
	if _, ok := s.m[rb]; !ok {
		t.Fatal("a refused round dropped its run's sum")
	}
	// A dimension whose size in bytes overflows int64 is refused too,
	// and drops nothing.
	wrap := *b
	wrap.SecAgg.Dim = 1 << 61
	if _, err := s.open(runB, content.Hash([]byte("wrap")), &wrap); err == nil {
		t.Fatal("a sum was made for a round whose size overflows")
	}
	if _, ok := s.m[rb]; !ok {
		t.Fatal("a round of an overflowing size dropped its run's sum")
	}
}

// threeSiteParams are a round's secure-aggregation parameters over three
// sites with fresh keys and four values.
func threeSiteParams(t *testing.T, round string) secagg.Params {
	t.Helper()
	p := secagg.Params{Round: round, Dim: 4, Clip: 1, PRG: secagg.DefaultPRG()}
	for _, id := range []string{"s1", "s2", "s3"} {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		p.Members = append(p.Members, secagg.Member{ID: id, Key: pub})
	}
	return p
}
