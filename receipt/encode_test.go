package receipt

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/scellis/scellis/content"
)

// TestBodyEncoding: the direct body encoder gives exactly content.Encode's
// bytes, for receipts with every field set, every omitempty field left
// out, nil and empty lists, negative and extreme integers.
func TestBodyEncoding(t *testing.T) {
	if n := reflect.TypeFor[body]().NumField(); n != bodyFields {
		t.Fatalf("body has %d fields, the direct encoder writes %d: teach appendBody the new ones", n, bodyFields)
	}
	if n := reflect.TypeFor[PeerSignature]().NumField(); n != 5 {
		t.Fatalf("PeerSignature has %d fields, the direct encoder writes 5: teach appendBody the new ones", n)
	}
	if n := reflect.TypeFor[Citation]().NumField(); n != 4 {
		t.Fatalf("Citation has %d fields, the direct encoder writes 4: teach appendBody the new ones", n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ints := []int64{0, 1, 23, 24, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64, -1, -24, -25, -256, -257, -65537, math.MinInt64}
	str := func() string {
		n := []int{0, 1, 23, 24, 255, 256, 300}[rng.IntN(7)]
		b := make([]byte, n)
		for i := range b {
			b[i] = "abcé/:_-0"[rng.IntN(9)]
		}
		return string(b)
	}
	for i := range 2000 {
		r := Receipt{
			Seq: uint64(ints[rng.IntN(10)]), Prev: content.Ref(str()), Job: content.Hash(fmt.Append(nil, i)),
			Shard: content.Ref(str()), ShardIndex: int(ints[rng.IntN(len(ints))]), Result: content.Ref(str()),
			Method: str(), WorkUnits: ints[rng.IntN(len(ints))], PriceBasis: str(), LeaderTime: ints[rng.IntN(len(ints))],
		}
		switch rng.IntN(3) {
		case 0: // nil Peers
		case 1:
			r.Peers = []string{}
		default:
			for range rng.IntN(30) {
				r.Peers = append(r.Peers, str())
			}
		}
		if rng.IntN(2) == 0 {
			r.Reverses = uint64(ints[rng.IntN(10)])
		}
		if rng.IntN(2) == 0 {
			r.Tier = str()
		}
		switch rng.IntN(3) {
		case 0:
		case 1:
			r.Signatures = []PeerSignature{}
		default:
			for range 1 + rng.IntN(5) {
				s := PeerSignature{Peer: str(), Result: content.Ref(str()), Key: str()}
				if rng.IntN(4) > 0 {
					s.Sig = make([]byte, []int{0, 64, 300}[rng.IntN(3)])
				}
				if rng.IntN(2) == 0 {
					s.Path = make([]byte, []int{0, PathStep, 5 * PathStep, 300}[rng.IntN(4)])
				}
				r.Signatures = append(r.Signatures, s)
			}
		}
		switch rng.IntN(3) {
		case 0:
		case 1:
			r.Cites = []Citation{}
		default:
			for range 1 + rng.IntN(3) {
				c := Citation{Peer: str(), Seq: uint64(ints[rng.IntN(10)]), Head: content.Ref(str())}
				if rng.IntN(4) > 0 {
					c.Sig = make([]byte, []int{0, 64, 300}[rng.IntN(3)])
				}
				r.Cites = append(r.Cites, c)
			}
		}
		want, err := content.Encode(bodyOf(&r))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendBody(nil, &r); !bytes.Equal(got, want) {
			t.Fatalf("receipt %+v:\n direct %x\n cbor   %x", r, got, want)
		}
		if got, want := r.ComputeHash(), content.Hash(want); got != want {
			t.Fatalf("hash %s, want %s", got, want)
		}
	}
	// Text that is not UTF-8 takes the reference encoder's path.
	bad := Receipt{Method: "\xff"}
	if got, want := bad.ComputeHash(), hashBodySlow(&bad); got != want {
		t.Fatalf("invalid UTF-8: %s vs %s", got, want)
	}
}

// TestAppendSealed: AppendSealed builds the chain Append builds, and
// refuses a receipt of the wrong shape or out of sequence.
func TestAppendSealed(t *testing.T) {
	var a, b Chain
	for i := range 5 {
		r := Receipt{Job: content.Hash([]byte("j")), Shard: content.Hash(fmt.Append(nil, i)), ShardIndex: i,
			Result: content.Hash([]byte("r")), Peers: []string{"w2", "w1"}, Method: "quorum-2-exact", WorkUnits: 3, LeaderTime: 9}
		want := a.Next(r)
		if err := a.Append(want); err != nil {
			t.Fatal(err)
		}
		got := b.Next(r)
		if err := b.AppendSealed(got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("sealed %+v, appended %+v", got, want)
		}
	}
	if err := b.AppendSealed(b.Next(Receipt{Job: "not a ref"})); err == nil {
		t.Fatal("malformed receipt appended")
	}
	old := b.All()[0]
	if err := b.AppendSealed(old); err == nil {
		t.Fatal("a receipt out of sequence appended")
	}
	if sa, ha := a.Head(); true {
		if sb, hb := b.Head(); sa != sb || ha != hb {
			t.Fatalf("heads differ: %d/%s vs %d/%s", sa, ha, sb, hb)
		}
	}
	if err := Verify(b.All()); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkMint: minting one receipt as the coordinator does now (Next
// then AppendSealed: one body, written by the direct encoder, one hash)
// against how it did (Next then Append: two bodies through the reflective
// encoder). "vs-next-append" is the
// rate ratio, in one run.
//
//	go test -run '^$' -bench Mint ./receipt/
//
// Both chains restart every chainReset receipts, so what is measured is
// minting, not the garbage collector scanning an ever longer chain.
const chainReset = 1024

func BenchmarkMint(b *testing.B) {
	r := Receipt{Job: content.Hash([]byte("j")), Shard: content.Hash([]byte("s")), ShardIndex: 7,
		Result: content.Hash([]byte("r")), Peers: []string{"w1", "w2"}, Method: "quorum-2-exact", WorkUnits: 3,
		PriceBasis: "program cost()", LeaderTime: 1_750_000_000_000}
	var old float64
	b.Run("next-append-reflective", func(b *testing.B) {
		// The minting path before: Next sealed the receipt (one body
		// through the reflective encoder), Append validated it (a second),
		// and the coordinator kept a copy of what Append had copied.
		var c Chain
		for b.Loop() {
			rc := r.Clone()
			sort.Strings(rc.Peers)
			rc.Peers = slices.Compact(rc.Peers)
			rc.Seq, rc.Prev = c.Head()
			rc.Seq++
			rc.Hash = hashBodySlow(&rc)
			if err := rc.validateShape(); err != nil || hashBodySlow(&rc) != rc.Hash {
				b.Fatal("invalid")
			}
			c.receipts = append(c.receipts, rc.Clone())
			_ = rc.Clone()
			if c.Len() == chainReset {
				c = Chain{}
			}
		}
		old = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(old, "receipts/s")
	})
	b.Run("next-append-sealed-direct", func(b *testing.B) {
		var c Chain
		for b.Loop() {
			if err := c.AppendSealed(c.Next(r)); err != nil {
				b.Fatal(err)
			}
			if c.Len() == chainReset {
				c = Chain{}
			}
		}
		rate := float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(rate, "receipts/s")
		if old > 0 {
			b.ReportMetric(rate/old, "vs-next-append")
		}
	})
	b.Run("mint", func(b *testing.B) {
		// The coordinator's path now: one copy, kept in its own slice.
		rs := make([]Receipt, 0, chainReset)
		for b.Loop() {
			var last *Receipt
			if len(rs) > 0 {
				last = &rs[len(rs)-1]
			}
			m, err := Mint(last, r)
			if err != nil {
				b.Fatal(err)
			}
			if rs = append(rs, m); len(rs) == chainReset {
				rs = rs[:0]
			}
		}
		rate := float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(rate, "receipts/s")
		if old > 0 {
			b.ReportMetric(rate/old, "vs-next-append")
		}
	})
}

// TestMint: Mint seals the same receipts as Chain.Next then AppendSealed,
// the slice it builds verifies as a chain, it does not share the caller's
// slices, and it refuses what AppendSealed refuses.
func TestMint(t *testing.T) {
	var c Chain
	var rs []Receipt
	for i := range 5 {
		peers := []string{"w2", "w1", "w2"}
		r := Receipt{Job: content.Hash([]byte("j")), Shard: content.Hash(fmt.Appendf(nil, "s%d", i)), ShardIndex: i,
			Result: content.Hash([]byte("r")), Peers: peers, Method: "quorum-2-exact", WorkUnits: 3,
			PriceBasis: "program cost()", LeaderTime: 1_750_000_000_000}
		var last *Receipt
		if len(rs) > 0 {
			last = &rs[len(rs)-1]
		}
		m, err := Mint(last, r)
		if err != nil {
			t.Fatal(err)
		}
		want := c.Next(r)
		if err := c.AppendSealed(want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("receipt %d: Mint %+v, Next %+v", i, m, want)
		}
		peers[0] = "changed"
		if m.Peers[0] != "w1" || m.Peers[1] != "w2" {
			t.Fatalf("the minted receipt shares the caller's peers: %v", m.Peers)
		}
		rs = append(rs, m)
	}
	if err := Verify(rs); err != nil {
		t.Fatalf("minted chain: %v", err)
	}
	if _, err := Mint(&rs[len(rs)-1], Receipt{Job: content.Hash([]byte("j")), Shard: content.Hash([]byte("s")),
		Result: content.Hash([]byte("r")), Method: "m"}); err == nil {
		t.Fatal("a receipt without peers was minted")
	}
}
