package wire

import (
	"bytes"
	"math"
	"testing"

	"github.com/scellis/scellis/secagg"
)

// FuzzParseResult: the result a site fetches is untrusted bytes; parsing
// either refuses them or accepts exactly the canonical encoding (parse
// then encode gives back the input).
func FuzzParseResult(f *testing.F) {
	seeds := []*secagg.Result{
		{Round: "r", Sum: []float64{1.5, -2, 0}, Weight: 3, Contributors: []string{"a", "b", "c"}, ErrorBound: 0x1p-57},
		{Round: "fl/run 7 ✓", Sum: []float64{math.SmallestNonzeroFloat64, math.MaxFloat64, math.Copysign(0, -1)}, Contributors: []string{"a", "b", "c", "d"}, Dropped: []string{"e"}},
	}
	for _, r := range seeds {
		b, err := encodeResult(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseResult(b)
		if err != nil {
			return
		}
		again, err := encodeResult(r)
		if err != nil {
			t.Fatalf("a parsed result does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("parse then encode changed the bytes:\n in  %x\n out %x", b, again)
		}
	})
}
