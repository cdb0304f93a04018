package content

import (
	"encoding/json"
	"strings"
	"testing"
)

// badRefs are the malformed refs every decoder refuses: separators, dots,
// upper case, wrong length, wrong algorithm.
var badRefs = map[string]string{
	"traversal":    "sha256:../../../../secret",
	"separator":    "sha256:" + strings.Repeat("a", 31) + "/" + strings.Repeat("a", 32),
	"backslash":    "sha256:" + strings.Repeat("a", 31) + `\` + strings.Repeat("a", 32),
	"dots":         "sha256:" + strings.Repeat(".", 64),
	"upper case":   "sha256:" + strings.Repeat("A", 64),
	"short":        "sha256:" + strings.Repeat("a", 63),
	"long":         "sha256:" + strings.Repeat("a", 65),
	"no prefix":    strings.Repeat("a", 64),
	"other alg":    "sha512:" + strings.Repeat("a", 64),
	"nul":          "sha256:" + strings.Repeat("a", 63) + "\x00",
	"prefix upper": "SHA256:" + strings.Repeat("a", 64),
}

func TestRefDecodersRefuseMalformed(t *testing.T) {
	for name, s := range badRefs {
		var r Ref
		if err := r.UnmarshalText([]byte(s)); err == nil {
			t.Errorf("%s: UnmarshalText accepted %q", name, s)
		}
		js, _ := json.Marshal(map[string]string{"ref": s})
		var jv struct{ Ref Ref }
		if err := json.Unmarshal(js, &jv); err == nil {
			t.Errorf("%s: JSON accepted %q", name, s)
		}
		cb, _ := Encode(map[string]string{"ref": s})
		var cv struct {
			Ref Ref `cbor:"ref"`
		}
		if err := Decode(cb, &cv); err == nil {
			t.Errorf("%s: CBOR accepted %q", name, s)
		}
		// As a map key too.
		cm, _ := Encode(map[string]int{s: 1})
		var m map[Ref]int
		if err := Decode(cm, &m); err == nil {
			t.Errorf("%s: CBOR map key accepted %q", name, s)
		}
		if _, err := ParseRef(s); err == nil {
			t.Errorf("%s: ParseRef accepted %q", name, s)
		}
	}
	// An error never carries a long payload back.
	long := "sha256:" + strings.Repeat("x", 10000)
	var r Ref
	if err := r.UnmarshalText([]byte(long)); err == nil || len(err.Error()) > 200 {
		t.Fatalf("error for a long bad ref: %v", err)
	}
}

func TestRefDecodersAcceptWellFormed(t *testing.T) {
	good := Hash([]byte("x"))
	for _, s := range []Ref{good, ""} {
		var jv struct{ Ref Ref }
		js, _ := json.Marshal(struct{ Ref Ref }{s})
		if err := json.Unmarshal(js, &jv); err != nil || jv.Ref != s {
			t.Errorf("JSON %q: %v %q", s, err, jv.Ref)
		}
		cb, _ := Encode(struct {
			Ref Ref `cbor:"ref"`
		}{s})
		var cv struct {
			Ref Ref `cbor:"ref"`
		}
		if err := Decode(cb, &cv); err != nil || cv.Ref != s {
			t.Errorf("CBOR %q: %v %q", s, err, cv.Ref)
		}
	}
	// A ref written with an escape is the same ref (the quick path takes
	// only plain literals; the others are decoded as JSON strings).
	var escaped Ref
	if err := json.Unmarshal([]byte(`"sha256\u003a`+good.Hex()+`"`), &escaped); err != nil || escaped != good {
		t.Errorf("escaped JSON ref: %v %q", err, escaped)
	}
	if good.Hex() != string(good)[len("sha256:"):] {
		t.Fatal("Hex")
	}
}

// FuzzRefDecoders: whatever the CBOR, JSON and text decoders accept is a
// well-formed ref (or the empty zero ref), identical across decoders, and
// re-encodes to the same bytes.
func FuzzRefDecoders(f *testing.F) {
	f.Add(string(Hash([]byte("seed"))))
	f.Add("")
	for _, s := range badRefs {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var tr Ref
		terr := tr.UnmarshalText([]byte(s))
		if terr == nil && s != "" && !IsRef(string(tr)) {
			t.Fatalf("text accepted malformed %q", s)
		}
		cb, err := Encode(s)
		if err != nil {
			return
		}
		var cr Ref
		cerr := Decode(cb, &cr)
		if (cerr == nil) != (terr == nil) || cr != tr {
			t.Fatalf("CBOR and text disagree on %q: %v / %v", s, cerr, terr)
		}
		if cerr == nil {
			out, _ := Encode(cr)
			if string(out) != string(cb) {
				t.Fatalf("CBOR round trip of %q changed bytes", s)
			}
		}
		js, err := json.Marshal(s)
		if err != nil {
			return
		}
		var jr Ref
		jerr := json.Unmarshal(js, &jr)
		if (jerr == nil) != (terr == nil) || jr != tr {
			t.Fatalf("JSON and text disagree on %q: %v / %v", s, jerr, terr)
		}
	})
}
