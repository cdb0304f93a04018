package receipt

import (
	"errors"
	"fmt"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

func ref(s string) content.Ref { return content.Hash([]byte(s)) }

func sample(i int) Receipt {
	return Receipt{
		Job:        ref("job"),
		Shard:      ref(fmt.Sprintf("shard %d", i)),
		ShardIndex: i,
		Result:     ref(fmt.Sprintf("result %d", i)),
		Peers:      []string{"w2", "w1"},
		Method:     "quorum-2-exact",
		WorkUnits:  int64(i + 1),
		PriceBasis: "flat 1 per shard",
		LeaderTime: 1000 + int64(i),
	}
}

func build(t testing.TB, n int) []Receipt {
	t.Helper()
	var c Chain
	for i := 0; i < n; i++ {
		if err := c.Append(c.Next(sample(i))); err != nil {
			t.Fatal(err)
		}
	}
	return c.All()
}

// The encoding is part of the format: a changed hash here changes every
// chain ever written. Bump only with a migration note.
func TestHashIsStable(t *testing.T) {
	var c Chain
	r := c.Next(sample(0))
	if r.Seq != 1 || r.Prev != Genesis {
		t.Fatalf("first receipt: seq %d prev %s", r.Seq, r.Prev)
	}
	if r.Peers[0] != "w1" {
		t.Fatalf("peers not sorted: %v", r.Peers)
	}
	if got := string(r.Hash); got != goldenHash {
		t.Fatalf("receipt hash changed:\n got %s\nwant %s", got, goldenHash)
	}
}

const goldenHash = "sha256:b2541ff42e6d45775f9c0cc39ce4feb92b500a236f867d9526cbb58973752e2d"

func TestAppendChecksSeqAndPrev(t *testing.T) {
	var c Chain
	r1 := c.Next(sample(0))
	if err := c.Append(r1); err != nil {
		t.Fatal(err)
	}
	r2 := c.Next(sample(1))
	for name, bad := range map[string]func(r Receipt) Receipt{
		"seq skipped":  func(r Receipt) Receipt { r.Seq++; r.Hash = r.ComputeHash(); return r },
		"seq repeated": func(r Receipt) Receipt { r.Seq--; r.Hash = r.ComputeHash(); return r },
		"wrong prev":   func(r Receipt) Receipt { r.Prev = Genesis; r.Hash = r.ComputeHash(); return r },
		"edited":       func(r Receipt) Receipt { r.WorkUnits = 99; return r },
		"no peers":     func(r Receipt) Receipt { r.Peers = nil; r.Hash = r.ComputeHash(); return r },
	} {
		err := c.Append(bad(r2.Clone()))
		if err == nil {
			t.Errorf("%s: appended", name)
			continue
		}
		if _, ok := diag.As(err); !ok {
			t.Errorf("%s: error is not a diagnostic: %v", name, err)
		}
	}
	if c.Len() != 1 {
		t.Fatalf("failed appends changed the chain: len %d", c.Len())
	}
	if err := c.Append(r2); err != nil {
		t.Fatal(err)
	}
	if seq, h := c.Head(); seq != 2 || h != r2.Hash {
		t.Fatalf("head (%d, %s)", seq, h)
	}
	if got := c.Since(1); len(got) != 1 || got[0].Hash != r2.Hash {
		t.Fatalf("Since(1) = %v", got)
	}
	if got := c.Since(5); len(got) != 0 {
		t.Fatalf("Since(5) = %v", got)
	}
}

func TestVerifyFindsFirstBreak(t *testing.T) {
	good := build(t, 5)
	if err := Verify(good); err != nil {
		t.Fatalf("good chain: %v", err)
	}
	if err := Verify(nil); err != nil {
		t.Fatalf("empty chain: %v", err)
	}
	if err := VerifyFrom(good[1].Seq, good[1].Hash, good[2:]); err != nil {
		t.Fatalf("suffix: %v", err)
	}
	clone := func() []Receipt {
		out := make([]Receipt, len(good))
		for i, r := range good {
			out[i] = r.Clone()
		}
		return out
	}
	cases := []struct {
		name   string
		mutate func([]Receipt) []Receipt
		index  int
		reason Reason
	}{
		{"edited price", func(rs []Receipt) []Receipt { rs[2].WorkUnits = 1000; return rs }, 2, Edited},
		{"edited peers", func(rs []Receipt) []Receipt { rs[3].Peers = []string{"w1", "w3"}; return rs }, 3, Edited},
		{"edited and rehashed", func(rs []Receipt) []Receipt {
			rs[2].WorkUnits = 1000
			rs[2].Hash = rs[2].ComputeHash()
			return rs
		}, 3, BrokenLink},
		{"gap", func(rs []Receipt) []Receipt { return append(rs[:2], rs[3:]...) }, 2, Gap},
		{"duplicate", func(rs []Receipt) []Receipt {
			return append(rs[:3], append([]Receipt{rs[2]}, rs[3:]...)...)
		}, 3, Duplicate},
		{"swapped", func(rs []Receipt) []Receipt { rs[1], rs[2] = rs[2], rs[1]; return rs }, 1, Reordered},
		{"moved back", func(rs []Receipt) []Receipt { return []Receipt{rs[0], rs[1], rs[3], rs[4], rs[2]} }, 2, Reordered},
		{"bad genesis", func(rs []Receipt) []Receipt {
			rs[0].Prev = ref("elsewhere")
			rs[0].Hash = rs[0].ComputeHash()
			return rs
		}, 0, BrokenLink},
		{"unsorted peers", func(rs []Receipt) []Receipt {
			rs[4].Peers = []string{"w2", "w1"}
			rs[4].Hash = rs[4].ComputeHash()
			return rs
		}, 4, Malformed},
	}
	for _, tc := range cases {
		err := Verify(tc.mutate(clone()))
		var b *Break
		if !errors.As(err, &b) {
			t.Errorf("%s: got %v, want a break", tc.name, err)
			continue
		}
		if b.Index != tc.index || b.Reason != tc.reason {
			t.Errorf("%s: break at %d (%s), want %d (%s): %v", tc.name, b.Index, b.Reason, tc.index, tc.reason, b)
		}
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.ReceiptChainBroken {
			t.Errorf("%s: no SC7013 diagnostic in %v", tc.name, err)
		}
	}
}

func TestNewChainVerifies(t *testing.T) {
	rs := build(t, 3)
	c, err := NewChain(rs)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Append(c.Next(sample(3))); err != nil {
		t.Fatal(err)
	}
	rs[1].Method = "trust me"
	if _, err := NewChain(rs); err == nil {
		t.Fatal("NewChain accepted an edited chain")
	}
}

func TestContributionsCreditEveryAgreeingPeer(t *testing.T) {
	var c Chain
	for i, peers := range [][]string{{"a", "b"}, {"b", "c"}, {"a"}} {
		r := sample(i)
		r.Peers = peers
		r.WorkUnits = int64(10 * (i + 1))
		if err := c.Append(c.Next(r)); err != nil {
			t.Fatal(err)
		}
	}
	got := Contributions(c.All())
	want := map[string]int64{"a": 10 + 30, "b": 10 + 20, "c": 20}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("contributions %v, want %v", got, want)
	}
}

func TestUnmarshalRoundTrip(t *testing.T) {
	for _, r := range build(t, 3) {
		b, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Hash != r.Hash || fmt.Sprint(got) != fmt.Sprint(r) {
			t.Fatalf("round trip changed the receipt:\n%+v\n%+v", got, r)
		}
		// A tampered byte is refused (or, if it still parses, is a different valid receipt).
		b[len(b)/2] ^= 1
		if got, err := Unmarshal(b); err == nil && got.Hash == r.Hash {
			t.Fatal("tampered receipt accepted with the same hash")
		}
	}
	if _, err := Unmarshal([]byte{0xa0}); err == nil {
		t.Fatal("empty map accepted as a receipt")
	}
}
