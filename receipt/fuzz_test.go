package receipt

import (
	"bytes"
	"testing"
)

// FuzzUnmarshal: whatever Unmarshal accepts, Marshal gives back byte for
// byte, and it is a valid receipt.
func FuzzUnmarshal(f *testing.F) {
	seeds := 0
	for _, r := range build(f, 4) {
		b, err := r.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		seeds++
	}
	f.Add([]byte{})
	f.Add([]byte{0xa0})
	if seeds == 0 {
		f.Fatal("no seed receipts: the fuzz corpus would be empty")
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Unmarshal(b)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("Unmarshal accepted an invalid receipt: %v", err)
		}
		again, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip not exact:\n in %x\nout %x", b, again)
		}
	})
}
