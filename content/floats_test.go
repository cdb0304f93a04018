package content

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestEncodeStringMapAgrees: EncodeStringMap gives Encode's bytes for maps
// of float vectors (every half, random singles and doubles, zeros of both
// signs, infinities, subnormals, NaN left to Encode) beside other values.
func TestEncodeStringMapAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var halves []float64
	for h := range 1 << 16 {
		if f := float16ToFloat64(uint16(h)); !math.IsNaN(f) {
			halves = append(halves, f)
		}
	}
	mixed := []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), 65504, 65520, 1e-8, 5.960464477539063e-08, math.SmallestNonzeroFloat64, math.MaxFloat64, -1.5}
	for range 10000 {
		switch r.IntN(3) {
		case 0:
			mixed = append(mixed, r.NormFloat64())
		case 1:
			mixed = append(mixed, float64(float32(r.NormFloat64()*1e3)))
		default:
			if f := math.Float64frombits(r.Uint64()); !math.IsNaN(f) { // NaN: left to Encode, tested below
				mixed = append(mixed, f)
			}
		}
	}
	long := make([]float64, 70000) // a length with a 4-byte head
	for i := range long {
		long[i] = float64(i) / 7
	}
	for _, m := range []map[string]any{
		nil,
		{},
		{"w": halves},
		{"w": mixed, "round": int64(3), "b": []float64{}, "c": []float64(nil), "tag": "x", "nested": map[string]any{"v": []float64{1.5}}},
		{"w": long, "zz": []float64{math.NaN(), 1}, "a": []any{1.5, "x"}},
	} {
		got, err := EncodeStringMap(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeStringMap differs from Encode for a map of %d keys (%d vs %d bytes)", len(m), len(got), len(want))
		}
		if m != nil && cap(got) != len(got) {
			t.Fatalf("buffer of %d for %d bytes: not sized exactly", cap(got), len(got))
		}
	}
}
