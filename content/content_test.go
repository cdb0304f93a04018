package content

import (
	"bytes"
	"math"
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

func TestDecodeRefusesNonCanonical(t *testing.T) {
	for name, in := range map[string]string{
		"bignum tag 2":         "\xc2H\xc20000000",
		"bignum tag 3":         "\xc3\x41\x01",
		"time tag 1":           "\xc1\x01",
		"long-form int":        "\x18\x05",
		"long-form length":     "\x78\x01a",
		"indefinite array":     "\x9f\x01\xff",
		"wide float":           "\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00", // 1.5 fits a half
		"NaN payload":          "\xf9\x7e\x01",
		"unsorted map keys":    "\xa2\x61b\x01\x61a\x02",
		"duplicate map keys":   "\xa2\x61a\x01\x61a\x02",
		"undefined":            "\xf7",
		"one-byte simple":      "\xf8\x20",
		"trailing bytes":       "\x01\x02",
		"array past the end":   "\x9a\xff\xff\xff\xff",
		"reserved information": "\x1c",
		"null map key":         "\xa1\xf6\x01",
		"byte-string map key":  "\xa1\x41a\x01",
	} {
		var v any
		if err := Decode([]byte(in), &v); err == nil {
			t.Errorf("%s: Decode(% x) accepted %v", name, in, v)
		}
	}
	// And the canonical forms of the same values decode.
	for _, v := range []any{int64(5), "a", 1.5, math.NaN(), map[string]any{"a": int64(2), "b": int64(1)}, []any{int64(1)}} {
		b, _ := Encode(v)
		if err := CheckCanonical(b); err != nil {
			t.Errorf("CheckCanonical(% x) of %v: %v", b, v, err)
		}
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
			t.Fatalf("decoded value does not encode: %v", err)
		}
		// Canonical means canonical: what Decode accepts is the one
		// encoding of its value.
		if !bytes.Equal(in, out) {
			t.Fatalf("Decode accepted a non-canonical encoding: % x re-encodes as % x", in, out)
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
