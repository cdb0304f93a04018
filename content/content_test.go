package content

import (
	"bytes"
	"testing"
)

func TestMapKeyOrderDoesNotMatter(t *testing.T) {
	a := map[string]any{"b": 1, "a": []any{1.5, "x"}, "c": map[string]any{"z": true, "y": nil}}
	b := map[string]any{"c": map[string]any{"y": nil, "z": true}, "a": []any{1.5, "x"}, "b": 1}
	ra, _ := HashOf(a)
	rb, _ := HashOf(b)
	if ra != rb {
		t.Fatalf("refs differ: %s %s", ra, rb)
	}
}

func TestRoundTripCanonical(t *testing.T) {
	v := map[string]any{"n": uint64(3), "f": 0.1, "s": "é", "l": []any{int64(-2), false}}
	b, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	var back any
	if err := Decode(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := Encode(back)
	if !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding changed bytes")
	}
}

func TestParseRef(t *testing.T) {
	r := Hash([]byte("x"))
	if _, err := ParseRef(string(r)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "sha256:", "sha256:XYZ", "md5:" + string(r)[7:], string(r)[:70]} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
	if len(r.Digest()) != 32 || len(r.Short()) != 12 {
		t.Fatal("digest/short lengths")
	}
}

func FuzzDecodeReencode(f *testing.F) {
	b, _ := Encode(map[string]any{"a": 1, "b": []any{"x", 2.5}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		var v any
		if err := Decode(in, &v); err != nil {
			return
		}
		out, err := Encode(v)
		if err != nil {
			return
		}
		var v2 any
		if err := Decode(out, &v2); err != nil {
			t.Fatalf("canonical output does not decode: %v", err)
		}
		out2, _ := Encode(v2)
		if !bytes.Equal(out, out2) {
			t.Fatal("canonical encoding not stable")
		}
	})
}
