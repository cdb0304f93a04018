package script

import (
	"context"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
)

// entry parses src as the content file path.
func entry(t testing.TB, path, src string) *catalog.Entry {
	t.Helper()
	e, err := catalog.Parse(path, []byte(strings.TrimLeft(src, "\n")))
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return e
}

// builtins is the embedded catalog.
func builtins(t testing.TB) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func lookup(t testing.TB, c *catalog.Catalog, name string) *catalog.Entry {
	t.Helper()
	e, ok := c.Lookup(name)
	if !ok {
		t.Fatalf("no catalog entry %q", name)
	}
	return e
}

// run calls fn of a one-off program with a seed and no catalog.
func run(t testing.TB, src string, fn string, args ...any) (any, error) {
	t.Helper()
	return Call(context.Background(), Env{Seed: []byte("seed")}, entry(t, "prog.star", src), fn, args...)
}

// wantDiag checks that err is a single diagnostic with code and returns it.
func wantDiag(t testing.TB, err error, code diag.Code) *diag.Diagnostic {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s (%s)", code, diag.Title(code))
	}
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("got %T %v, want diagnostic %s", err, err, code)
	}
	if ds[0].Code != code {
		t.Fatalf("got %s, want %s (%s)", ds[0].Error(), code, diag.Title(code))
	}
	return ds[0]
}

// wantPos checks a diagnostic's position; line or col 0 means any.
func wantPos(t testing.TB, d *diag.Diagnostic, file string, line, col int) {
	t.Helper()
	if d.Pos == nil || d.Pos.File != file || (line > 0 && d.Pos.Line != line) || (col > 0 && d.Pos.Col != col) {
		t.Fatalf("position %v, want %s:%d:%d\n%s", d.Pos, file, line, col, d.Error())
	}
}
