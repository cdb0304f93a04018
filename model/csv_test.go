package model

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

func TestParseCSV(t *testing.T) {
	src := "\ufeffage, bmi ,outcome,smoker\n61,27.5,1,0\n  45,31.2,0,1\n\n50,22,1,1\n"
	d, err := ParseCSV(strings.NewReader(src), "site", "outcome")
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "site" || d.Label != "outcome" || !slices.Equal(d.Features, []string{"age", "bmi", "smoker"}) {
		t.Fatalf("header: %+v", d)
	}
	if d.Rows() != 3 || d.Dims() != 3 {
		t.Fatalf("shape %d×%d", d.Rows(), d.Dims())
	}
	if !slices.Equal(d.Row(1), []float64{45, 31.2, 1}) || !slices.Equal(d.Y, []float64{1, 0, 1}) {
		t.Errorf("rows: %v, labels %v", d.Row(1), d.Y)
	}
	if !slices.Equal(d.Classes(), []float64{0, 1}) {
		t.Errorf("classes %v", d.Classes())
	}
}

func TestCSVDiagnostics(t *testing.T) {
	cases := []struct {
		name, src, label string
		code             diag.Code
		line, col        int
		help             string
	}{
		{"ragged long", "a,b,y\n1,2,3\n4,5,6,7\n", "y", diag.CSVRagged, 3, 7, "a, b, y"},
		{"ragged short", "a,b,y\n1,2,3\n4,5\n", "y", diag.CSVRagged, 3, 4, ""},
		{"no label", "age,bmi,Outcome\n1,2,3\n", "outcome", diag.CSVNoLabel, 1, 1, `did you mean "Outcome"? the columns are: age, bmi, Outcome`},
		{"no label list", "age,bmi\n1,2\n", "y", diag.CSVNoLabel, 1, 1, "the columns are: age, bmi"},
		{"bad number", "a,b,y\n1,2,3\n4,x5,6\n", "y", diag.CSVBadNumber, 3, 3, ""},
		{"bad label", "a,b,y\n1,2,yes\n", "y", diag.CSVBadNumber, 2, 5, ""},
		{"empty field", "a,b,y\n1,,3\n", "y", diag.CSVBadNumber, 2, 3, ""},
		{"nan", "a,b,y\n1,NaN,3\n", "y", diag.CSVBadNumber, 2, 3, ""},
		{"header only", "a,b,y\n", "y", diag.CSVEmpty, 2, 0, ""},
		{"empty", "", "y", diag.CSVEmpty, 1, 0, ""},
		{"only label", "y\n1\n", "y", diag.CSVEmpty, 1, 1, ""},
		{"quote", "a,b,y\n1,\"2,3\n", "y", diag.CSVUnreadable, 2, 0, ""},
		{"duplicate", "a,b,a,y\n1,2,3,4\n", "y", diag.ConfigDuplicate, 1, 5, ""},
	}
	for _, tc := range cases {
		_, err := ParseCSV(strings.NewReader(tc.src), "data.csv", tc.label)
		var d *diag.Diagnostic
		if !errors.As(err, &d) {
			t.Errorf("%s: got %v, want a diagnostic", tc.name, err)
			continue
		}
		if d.Code != tc.code || d.Pos == nil || d.Pos.File != "data.csv" || d.Pos.Line != tc.line || (tc.col != 0 && d.Pos.Col != tc.col) {
			t.Errorf("%s: got %s at %v, want %s at data.csv:%d:%d", tc.name, d.Code, d.Pos, tc.code, tc.line, tc.col)
		}
		if !strings.Contains(d.Help, tc.help) {
			t.Errorf("%s: help %q lacks %q", tc.name, d.Help, tc.help)
		}
	}
}

func TestLoadCSV(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "site-1.csv")
	if err := os.WriteFile(path, []byte("x,y\n1,0\n2,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := LoadCSV(path, "y")
	if err != nil || d.Name != "site-1" || d.Rows() != 2 {
		t.Fatalf("LoadCSV: %v %+v", err, d)
	}
	_, err = LoadCSV(filepath.Join(dir, "missing.csv"), "y")
	if dg, ok := diag.As(err); !ok || dg[0].Code != diag.CSVUnreadable {
		t.Errorf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("x,y\n1,0\n2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCSV(path, "y")
	if dg, ok := diag.As(err); !ok || dg[0].Pos.File != path || dg[0].Pos.Line != 3 {
		t.Errorf("ragged file: %v", err)
	}
}

func TestCSVRoundTrip(t *testing.T) {
	d := classData(50, 4, 3, 1)
	d.X.Set(0, 0, 1e-300)
	d.X.Set(1, 1, -0.1)
	var buf bytes.Buffer
	if err := WriteCSV(&buf, d); err != nil {
		t.Fatal(err)
	}
	e, err := ParseCSV(&buf, d.Name, d.Label)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Features, e.Features) || !slices.Equal(d.Y, e.Y) || !slices.Equal(d.X.RawMatrix().Data, e.X.RawMatrix().Data) {
		t.Error("WriteCSV then ParseCSV changed the dataset")
	}
}

// FuzzParseCSV: the parser never panics, and what it accepts survives a
// write/parse round trip exactly.
func FuzzParseCSV(f *testing.F) {
	for _, s := range []string{"a,b,y\n1,2,3\n", "y,a\n1,2\n3,4\n", "a,y\n1e300,-0\n", "a,y\n\"1\",2\n", "a,y\n1,2,3\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		d, err := ParseCSV(strings.NewReader(src), "fuzz", "y")
		if err != nil {
			if _, ok := diag.As(err); !ok {
				t.Fatalf("non-diagnostic error %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteCSV(&buf, d); err != nil {
			t.Fatal(err)
		}
		e, err := ParseCSV(&buf, "fuzz", "y")
		if err != nil {
			// Header names may need quoting the writer gives them; they must
			// still parse.
			t.Fatalf("re-parse: %v\n%s", err, buf.String())
		}
		if !slices.Equal(d.Y, e.Y) || !slices.Equal(d.X.RawMatrix().Data, e.X.RawMatrix().Data) {
			t.Fatal("round trip changed the data")
		}
	})
}
