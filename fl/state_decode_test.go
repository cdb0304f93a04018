package fl

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"github.com/scellis/scellis/content"
)

// decodeGlobalGeneric is DecodeGlobal without the vector fast path: the
// whole state through the generic decoder, then normalize.
func decodeGlobalGeneric(b []byte) (Global, error) {
	var m map[string]any
	if err := content.Decode(b, &m); err != nil {
		return nil, err
	}
	return Global(normalize(m).(map[string]any)), nil
}

// DecodeGlobal's fast path for float lists gives exactly what the generic
// decoder and normalize give, for every float width the canonical encoding
// picks (half, single, double, subnormals, ±0, ±Inf), long lists (multi-byte
// length headers), and lists it must leave alone (ints, mixed, empty,
// nested).
func TestDecodeGlobalFastPath(t *testing.T) {
	long := make([]float64, 70000) // a 4-byte length header
	for i := range long {
		long[i] = float64(i%7) * 0.25 * math.Pow(-1.5, float64(i%5)) / 3
	}
	cases := []Global{
		{"w": []float64{0, math.Copysign(0, -1), 1, -2.5, 65504, 5.960464477539063e-08, 1e-300, 0.1, float64(float32(0.1)), math.Inf(1), math.Inf(-1)}, "round": int64(3)},
		{"w": long, "c": []float64{1.5}, "name": "x"},
		{"w": []any{int64(1), int64(2)}, "mixed": []any{1.5, "a"}, "empty": []any{}},
		{"nested": map[string]any{"v": []float64{1, 2.75}, "l": []any{[]float64{3, 4}}}, "flag": true, "none": nil},
		{"w": make([]float64, 23), "x": make([]float64, 24), "y": make([]float64, 256)},
	}
	for i, g := range cases {
		b, err := g.Encode()
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		fast, err := DecodeGlobal(b)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		slow, err := decodeGlobalGeneric(b)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("case %d: fast path %v, generic %v", i, fast, slow)
		}
		for k, v := range fast { // DeepEqual says 0 == -0: compare the bits
			if vec, ok := v.([]float64); ok {
				for j, f := range vec {
					if math.Float64bits(f) != math.Float64bits(slow[k].([]float64)[j]) {
						t.Fatalf("case %d: %s[%d] = %v, generic %v", i, k, j, f, slow[k].([]float64)[j])
					}
				}
			}
		}
		again, err := fast.Encode()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("case %d: re-encoding differs (%v)", i, err)
		}
	}
	// Damaged input is refused as before, never read past its end.
	b, _ := Global{"w": []float64{1.5, 2.5, 3.5}}.Encode()
	for cut := 1; cut < len(b); cut++ {
		if _, err := DecodeGlobal(b[:cut]); err == nil {
			t.Fatalf("a global cut at %d of %d bytes decoded", cut, len(b))
		}
	}
	for _, item := range [][]byte{{0x83, 0xf9, 0x3c}, {0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb}, {0x82, 0xfb, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, ok := floatArray(item); ok {
			t.Fatalf("floatArray took the damaged item % x", item)
		}
	}
}

func TestHalfFloat(t *testing.T) {
	for h, want := range map[uint16]float64{0x0000: 0, 0x3c00: 1, 0xc000: -2, 0x7bff: 65504, 0x0001: 5.960464477539063e-08, 0x03ff: 6.097555160522461e-05, 0x7c00: math.Inf(1), 0xfc00: math.Inf(-1), 0x3555: 0.333251953125} {
		if got := halfFloat(h); got != want {
			t.Errorf("halfFloat(%#04x) = %v, want %v", h, got, want)
		}
	}
	if !math.IsNaN(halfFloat(0x7e00)) {
		t.Error("halfFloat of a NaN is not NaN")
	}
}
