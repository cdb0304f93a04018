package datagen

import (
	"bytes"
	"testing"

	"github.com/scellis/scellis/diag"
)

// Glyphs: the same seed gives the same bytes; pixels lie in [0, 1]; a
// site draws most of its images from its own three classes (skew), the
// held-out set draws every class; bad arguments are diag.InvalidValue.
func TestGlyphs(t *testing.T) {
	a, ha, err := Glyphs(4, 400, 500, 0.8, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, hb, _ := Glyphs(4, 400, 500, 0.8, 3)
	for i := range a {
		if !bytes.Equal(csvBytes(t, a[i:i+1])[0], csvBytes(t, b[i:i+1])[0]) {
			t.Fatalf("site %d differs under the same seed", i)
		}
	}
	if !bytes.Equal(csvBytes(t, []Site{*ha})[0], csvBytes(t, []Site{*hb})[0]) {
		t.Fatal("the held-out set differs under the same seed")
	}
	for k, s := range a {
		if s.Data.Dims() != GlyphPixels || s.Data.Rows() != 400 {
			t.Fatalf("site %d: %d×%d", k, s.Data.Rows(), s.Data.Dims())
		}
		own := 0
		for r := range s.Data.Rows() {
			c := int(s.Data.Y[r])
			if c == (2*k)%10 || c == (2*k+1)%10 || c == (2*k+2)%10 {
				own++
			}
			for _, v := range s.Data.Row(r) {
				if v < 0 || v > 1 {
					t.Fatalf("site %d row %d: pixel %v", k, r, v)
				}
			}
		}
		// 0.8 + 0.2·3/10 = 86% expected from its own classes.
		if f := float64(own) / 400; f < 0.8 || f > 0.92 {
			t.Fatalf("site %d draws %.2f of its images from its own classes", k, f)
		}
	}
	if n := len(ha.Data.Classes()); n != GlyphClasses {
		t.Fatalf("the held-out set has %d classes", n)
	}
	for _, args := range [][4]float64{{0, 10, 0, 0.5}, {2, 10, 0, 1.5}, {2, 0, 0, 0.5}} {
		_, _, err := Glyphs(int(args[0]), int(args[1]), int(args[2]), args[3], 1)
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.InvalidValue {
			t.Errorf("Glyphs%v: %v", args, err)
		}
	}
}
