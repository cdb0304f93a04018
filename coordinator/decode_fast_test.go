package coordinator

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/scellis/scellis/content"
)

// randomReport is a report with each optional field set or not, and
// integers at their extremes now and then.
func randomReport(rng *rand.Rand) ReportResult {
	ints := []int64{0, 1, 23, 24, 255, 256, 65535, 65536, 1 << 32, math.MaxInt64, -1, -24, -25, -256, -65537, math.MinInt64}
	pick := func() int64 {
		if rng.IntN(2) == 0 {
			return ints[rng.IntN(len(ints))]
		}
		return rng.Int64N(1 << 45)
	}
	c := ReportResult{
		Peer: fmt.Sprintf("peer-%d", rng.IntN(1000)), Job: content.Hash(fmt.Appendf(nil, "j%d", rng.Int())),
		Shard: int(pick()), Result: content.Hash(fmt.Appendf(nil, "r%d", rng.Int())), Now: pick(),
	}
	if rng.IntN(2) == 0 {
		c.Nonce = fmt.Sprintf("%x", rng.Uint64())
	}
	if rng.IntN(2) == 0 {
		c.Key = "ed25519:ké" + fmt.Sprint(rng.IntN(9))
		c.Sig = make([]byte, 1+rng.IntN(70))
		for i := range c.Sig {
			c.Sig[i] = byte(rng.IntN(256))
		}
		if rng.IntN(2) == 0 {
			c.Path = make([]byte, 33*(1+rng.IntN(8)))
			for i := range c.Path {
				c.Path[i] = byte(rng.IntN(256))
			}
		}
	}
	if rng.IntN(8) == 0 {
		c.Peer = ""
	}
	return c
}

// TestDecodeFast: reports and batches of reports, as EncodeCommand writes
// them, take the direct decoder and come back equal to what the general
// decoder gives; other commands are left to it.
func TestDecodeFast(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		var c Command = randomReport(rng)
		if i%3 == 0 {
			var bt Batch
			for range 1 + rng.IntN(20) {
				bt.Commands = append(bt.Commands, randomReport(rng))
			}
			c = bt
		}
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		fast, ok := decodeFast(b)
		if !ok {
			t.Fatalf("%T not decoded directly: %x", c, b)
		}
		slow, err := decodeGeneral(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) || !reflect.DeepEqual(fast, c) {
			t.Fatalf("direct %+v\ngeneral %+v\nencoded %+v", fast, slow, c)
		}
	}
	for _, c := range sampleCommands() {
		b, _ := EncodeCommand(c)
		_, isReport := c.(ReportResult)
		if _, ok := decodeFast(b); ok != isReport {
			t.Errorf("%T: decoded directly %v", c, ok)
		}
	}
}

// FuzzDecodeFast: whatever the direct decoder accepts (from canonical
// bytes), the general path accepts too, as an equal command that encodes
// back to the same bytes.
func FuzzDecodeFast(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		b, _ := EncodeCommand(randomReport(rng))
		f.Add(b)
	}
	b, _ := EncodeCommand(Batch{Commands: []Command{randomReport(rng), randomReport(rng)}})
	f.Add(b)
	for _, c := range sampleCommands() {
		b, _ := EncodeCommand(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if content.CheckCanonical(b) != nil {
			return
		}
		fast, ok := decodeFast(b)
		if !ok {
			return
		}
		slow, err := decodeGeneral(b)
		if err != nil {
			t.Fatalf("direct decoder accepted what the general path refuses (%v): %x", err, b)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("direct %+v\ngeneral %+v", fast, slow)
		}
		if again, err := EncodeCommand(fast); err != nil || !bytes.Equal(again, b) {
			t.Fatalf("direct decoding does not encode back: %v", err)
		}
	})
}

// BenchmarkDecodeReports: decoding a batch of 16 signed reports (what a
// batching worker's POST /v1/results/batch proposes) as every replica
// does, through DecodeCommand's direct decoder against the general path
// (the reflective decoder and the re-encoding that proves the input
// canonical). "x-general" is the rate ratio, in one run.
//
//	go test -run '^$' -bench DecodeReports ./coordinator/
func BenchmarkDecodeReports(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	var bt Batch
	for range 16 {
		r := randomReport(rng)
		r.Key, r.Sig, r.Nonce = "ed25519:"+string(bytes.Repeat([]byte{'k'}, 43)), bytes.Repeat([]byte{7}, 64), ""
		r.Shard, r.Now = rng.IntN(5000), 1_750_000_000_000+rng.Int64N(1e6)
		bt.Commands = append(bt.Commands, r)
	}
	cmd, err := EncodeCommand(bt)
	if err != nil {
		b.Fatal(err)
	}
	var general float64
	b.Run("general", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeGeneral(cmd); err != nil {
				b.Fatal(err)
			}
		}
		general = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(general*16, "reports/s")
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeCommand(cmd); err != nil {
				b.Fatal(err)
			}
		}
		rate := float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(rate*16, "reports/s")
		if general > 0 {
			b.ReportMetric(rate/general, "x-general")
		}
	})
}
