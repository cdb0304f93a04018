package content

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// shortestFloat against the encoder itself: for random bit patterns of each
// width, a head is accepted exactly when encoding its value gives it back.
func TestShortestFloatMatchesTheEncoder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	check := func(ai byte, bits uint64, head []byte, v float64) {
		t.Helper()
		want, err := Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := shortestFloat(ai, bits); got != bytes.Equal(want, head) {
			t.Fatalf("width %d bits %#x (%v): shortestFloat %v, encoder writes % x", ai, bits, v, got, want)
		}
	}
	for i := range 200000 {
		h := uint16(r.Uint32())
		if i < 1<<16 {
			h = uint16(i) // every half
		}
		check(25, uint64(h), []byte{0xf9, byte(h >> 8), byte(h)}, float16ToFloat64(h))

		f := r.Uint32()
		if i%3 == 0 { // values near the half range, where widths meet
			f = math.Float32bits(float32(float16ToFloat64(uint16(r.Uint32()))))
		}
		b := []byte{0xfa, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], f)
		check(26, uint64(f), b, float64(math.Float32frombits(f)))

		d := r.Uint64()
		if i%3 == 0 {
			d = math.Float64bits(float64(math.Float32frombits(r.Uint32())))
		}
		b = []byte{0xfb, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(b[1:], d)
		check(27, d, b, math.Float64frombits(d))
	}
}

// float16ToFloat64 widens an IEEE 754 half-precision value exactly.
func float16ToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	default:
		return sign * math.Ldexp(1024+frac, exp-25)
	}
}

// BenchmarkCanonicalCheck reports what Decode's canonical check costs on a
// float vector, as a ratio to the decoding itself.
func BenchmarkCanonicalCheck(b *testing.B) {
	v := make([]float64, 1<<16)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range v {
		v[i] = r.NormFloat64()
	}
	enc, _ := Encode(v)
	var check, decode float64
	for b.Loop() {
		t0 := time.Now()
		if err := CheckCanonical(enc); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var out []float64
		if err := decMode.Unmarshal(enc, &out); err != nil {
			b.Fatal(err)
		}
		check += t1.Sub(t0).Seconds()
		decode += time.Since(t1).Seconds()
	}
	b.ReportMetric(check/decode, "check/decode")
}
