package yamlpos

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want string // "" means a node, "nil" no document, else "line code"
	}{
		{"a: 1\n", ""},
		{"", "nil"},
		{"# only a comment\n", "nil"},
		{"a: 1\nb: [\n", "2 SC1001"},
		{"a: 1\n---\nb: 2\n", "3 SC1001"},
	} {
		n, err := Parse("f.yaml", []byte(tc.src), "thing")
		got := ""
		switch {
		case err != nil:
			d := err.(*diag.Diagnostic)
			got = fmt.Sprintf("%d %s", d.Pos.Line, d.Code)
			if d.Pos.File != "f.yaml" || d.Subject != "thing" || strings.HasPrefix(d.Message, "yaml:") {
				t.Errorf("%q: diagnostic %+v", tc.src, d)
			}
		case n == nil:
			got = "nil"
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %q, want %q", tc.src, got, tc.want)
		}
	}
}

func TestDecoderCollectsInPositionOrder(t *testing.T) {
	src := "name: x\ncount: many\nnmae: y\nname: z\nratio: 2.5\nlist: 3\n"
	n, err := Parse("f.yaml", []byte(src), "thing")
	if err != nil {
		t.Fatal(err)
	}
	d := &Decoder{File: "f.yaml"}
	f := d.Fields(n, "thing", "name", "count", "ratio", "list", "flag")
	if d.Required(n, f, "flag", "thing") != nil { // missing: reported at the mapping
		t.Error("Required returned a node for a missing key")
	}
	if v := d.Number(f["ratio"], "ratio", 0, 1); v != 0 {
		t.Errorf("out-of-range number returned %v", v)
	}
	d.Integer(f["count"], "count", 0, 10)
	d.Seq(f["list"], "list")
	if d.Str(f["name"], "name") != "x" {
		t.Error("first name not kept")
	}
	err = d.Err()
	var got []string
	for _, dg := range d.Diags {
		got = append(got, fmt.Sprintf("%d:%d %s", dg.Pos.Line, dg.Pos.Col, dg.Code))
	}
	want := "1:1 SC1004,2:8 SC1003,3:1 SC1002,4:1 SC1007,5:8 SC1005,6:7 SC1003"
	if strings.Join(got, ",") != want || err == nil {
		t.Fatalf("got %s\nwant %s", strings.Join(got, ","), want)
	}
	if !strings.Contains(d.Diags[2].Help, `did you mean "name"?`) {
		t.Errorf("no suggestion: %q", d.Diags[2].Help)
	}
}

func TestParseRefusesAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	_, err := Parse("bomb.yaml", []byte(b.String()), "job")
	var dg *diag.Diagnostic
	if !errors.As(err, &dg) || dg.Code != diag.YAMLAliasBomb {
		t.Fatalf("billion laughs: got %v, want %s", err, diag.YAMLAliasBomb)
	}
	// Modest reuse of an anchor is fine.
	n, err := Parse("ok.yaml", []byte("base: &b {lr: 0.1, epochs: 2}\none: *b\ntwo: *b\n"), "job")
	if err != nil || n == nil {
		t.Fatalf("modest aliases refused: %v", err)
	}
}
