package catalog

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

func wantDiag(t *testing.T, err error, code diag.Code) *diag.Diagnostic {
	t.Helper()
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("got %v, want diagnostic %s", err, code)
	}
	if ds[0].Code != code {
		t.Fatalf("got %s, want %s", ds[0].Error(), code)
	}
	return ds[0]
}

func mustParse(t *testing.T, path, src string) *Entry {
	t.Helper()
	e, err := Parse(path, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestParseDeducesKind(t *testing.T) {
	for _, tc := range []struct {
		src  string
		kind Kind
	}{
		{"def run(params, inputs):\n    return 1\n", Program},
		{"def cost(params):\n    return 1\ndef run(params, inputs):\n    return 1\n", Program},
		{"def partition(params):\n    return []\n", Partitioner},
		{"def reduce(results, params):\n    return 1\n", Reducer},
		{"def client_step(model, data, state):\n    return model\ndef server_step(model, updates, state):\n    return model\n", Strategy},
		{"def topology(members, params):\n    return {}\n", Topology},
		{"def helper(x):\n    return x\n", Library},
		{"X = 1\n", Library},
		{"def run(params, inputs, *rest):\n    return 1\n", Program},
		{"def reduce(results, params = None, extra = 1):\n    return 1\n", Reducer},
	} {
		e, err := Parse("x.star", []byte(tc.src))
		if err != nil {
			t.Fatalf("%q: %v", tc.src, err)
		}
		if e.Kind != tc.kind {
			t.Errorf("%q: kind %s, want %s", tc.src, e.Kind, tc.kind)
		}
	}
}

func TestParseMetadata(t *testing.T) {
	src := `"""mine: a reducer.

params: none."""

load("numeric", "add")
load("select", "best")
load("numeric", "scale")

def reduce(results, params):
    return add(1, 2)

def _helper():
    pass
`
	e := mustParse(t, "some/dir/mine.star", src)
	if e.Name != "mine" || e.Path != "some/dir/mine.star" || e.Kind != Reducer {
		t.Fatalf("entry %+v", e)
	}
	if e.Ref != content.Hash([]byte(src)) || string(e.Source) != src {
		t.Fatal("ref is not the hash of the source")
	}
	if e.Doc != "mine: a reducer.\n\nparams: none." {
		t.Errorf("doc %q", e.Doc)
	}
	if !reflect.DeepEqual(e.Loads, []string{"numeric", "select"}) {
		t.Errorf("loads %v", e.Loads)
	}
	if !reflect.DeepEqual(e.Funcs, []string{"_helper", "reduce"}) || !e.HasFunc("reduce") || e.HasFunc("run") {
		t.Errorf("funcs %v", e.Funcs)
	}
	if e.Subject() != "reducer mine" || e.SourceLine(9) != "def reduce(results, params):" {
		t.Errorf("subject %q line %q", e.Subject(), e.SourceLine(9))
	}
}

func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, path, src string
		code            diag.Code
		line, col       int
	}{
		{"syntax", "bad.star", "def run(params, inputs):\n    return (1 + * 2)\n", diag.StarlarkSyntax, 2, 17},
		{"indent", "bad.star", "def run(params, inputs):\nreturn 1\n", diag.StarlarkSyntax, 2, 7},
		{"top-level for", "bad.star", "for x in []:\n    pass\n", diag.StarlarkSyntax, 1, 1},
		{"while", "bad.star", "def f():\n    while True:\n        pass\n", diag.StarlarkSyntax, 2, 5},
		{"global reassign", "bad.star", "X = 1\nX = 2\n", diag.StarlarkSyntax, 2, 1},
		{"two kinds", "two.star", "def run(params, inputs):\n    pass\ndef reduce(results, params):\n    pass\n", diag.ContentKind, 0, 0},
		{"half strategy", "s.star", "def client_step(m):\n    pass\n", diag.MissingFunction, 0, 0},
		{"cost alone", "c.star", "def cost(params):\n    return 1\n", diag.MissingFunction, 1, 1},
		{"arity", "a.star", "def run(params):\n    return 1\n", diag.MissingFunction, 1, 1},
		{"topology arity", "t.star", "def topology(members):\n    return {}\n", diag.MissingFunction, 1, 1},
		{"bad name", "my prog.star", "X = 1\n", diag.InvalidValue, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.path, []byte(tc.src))
			d := wantDiag(t, err, tc.code)
			if d.Pos == nil || d.Pos.File != tc.path || d.Pos.Line != tc.line || d.Pos.Col != tc.col {
				t.Fatalf("position %v, want %s:%d:%d (%s)", d.Pos, tc.path, tc.line, tc.col, d.Error())
			}
			if tc.line > 0 && d.Source == "" {
				t.Errorf("no source line quoted: %s", d.Error())
			}
		})
	}
}

func TestAddLookupDuplicate(t *testing.T) {
	c := New()
	a := mustParse(t, "x/grid.star", "def partition(params):\n    return [{}]\n")
	if err := c.Add(a); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(mustParse(t, "y/grid.star", "def partition(params):\n    return [{}]\n")); err != nil {
		t.Fatalf("same bytes under the same name: %v", err)
	}
	err := c.Add(mustParse(t, "z/grid.star", "def partition(params):\n    return []\n"))
	d := wantDiag(t, err, diag.CatalogDuplicate)
	if !strings.Contains(d.Message, "x/grid.star") {
		t.Errorf("message %q should name the existing file", d.Message)
	}
	for _, key := range []string{"grid", string(a.Ref)} {
		if e, ok := c.Lookup(key); !ok || e != a {
			t.Errorf("Lookup(%s) = %v, %v", key, e, ok)
		}
	}
	bad := *a
	bad.Source = []byte("changed")
	if err := c.Add(&bad); err == nil {
		t.Error("an entry whose ref does not match its source was added")
	}
}

func TestBuiltinsLoadThroughParse(t *testing.T) {
	c, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	list := c.List()
	if len(list) < 15 {
		t.Fatalf("only %d built-in entries", len(list))
	}
	for i, e := range list {
		if i > 0 && list[i-1].Name >= e.Name {
			t.Fatal("List is not sorted by name")
		}
		src, err := builtinFS.ReadFile(e.Path)
		if err != nil {
			t.Fatalf("%s: %v", e.Path, err)
		}
		// The same bytes through Parse, as a user's file, give the same entry.
		user, err := Parse(filepath.Join(t.TempDir(), e.Name+".star"), src)
		if err != nil {
			t.Fatal(err)
		}
		if user.Name != e.Name || user.Kind != e.Kind || user.Ref != e.Ref || !reflect.DeepEqual(user.Funcs, e.Funcs) {
			t.Errorf("%s: built-in and user parse differ", e.Name)
		}
		if e.Doc == "" {
			t.Errorf("%s has no docstring", e.Name)
		}
	}
}

// A user-written strategy (client_step + server_step) loads through exactly
// the path a built-in takes: Parse, Add, Lookup, Resolve.
func TestUserStrategyLoadsLikeBuiltin(t *testing.T) {
	dir := t.TempDir()
	src := `"""my-fedavg: a user's strategy."""

def client_step(global_model, data, state):
    return global_model

def server_step(global_model, updates, state):
    return global_model
`
	path := filepath.Join(dir, "my-fedavg.star")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := c.Lookup("my-fedavg")
	if !ok || e.Kind != Strategy || e.Path != path {
		t.Fatalf("user strategy %+v, %v", e, ok)
	}
	if _, ok := c.Lookup("grid"); !ok {
		t.Fatal("Open lost the built-ins")
	}
	r, err := c.Resolve(string(e.Ref), "")
	if err != nil || r != e {
		t.Fatalf("Resolve by ref: %v %v", r, err)
	}
}

func TestResolve(t *testing.T) {
	c, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	grid, _ := c.Lookup("grid")
	if e, err := c.Resolve("grid", ""); err != nil || e != grid {
		t.Fatalf("by name: %v %v", e, err)
	}
	if e, err := c.Resolve(string(grid.Ref), ""); err != nil || e != grid {
		t.Fatalf("by ref: %v %v", e, err)
	}
	_, err = c.Resolve("gird", "")
	d := wantDiag(t, err, diag.UnknownContent)
	if !strings.Contains(d.Help, `did you mean "grid"`) {
		t.Errorf("help %q", d.Help)
	}
	_, err = c.Resolve("sha256:"+strings.Repeat("0", 64), "")
	wantDiag(t, err, diag.UnknownContent)
	_, err = c.Resolve("sha256:xyz", "")
	wantDiag(t, err, diag.UnknownContent)

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "prog.star"), []byte("def run(params, inputs):\n    return 1\n"), 0o644)
	e, err := c.Resolve("prog.star", dir)
	if err != nil || e.Kind != Program || e.Path != filepath.Join(dir, "prog.star") {
		t.Fatalf("by path: %+v %v", e, err)
	}
	if got, _ := c.Lookup("prog"); got != e {
		t.Fatal("a resolved path is not added to the catalog")
	}
	_, err = c.Resolve("missing.star", dir)
	wantDiag(t, err, diag.FileUnreadable)
	// A user file cannot shadow a built-in.
	os.WriteFile(filepath.Join(dir, "sum.star"), []byte("def reduce(results, params):\n    return 0\n"), 0o644)
	_, err = c.Resolve("./sum.star", dir)
	wantDiag(t, err, diag.CatalogDuplicate)
}

func TestClosure(t *testing.T) {
	c, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	mean, _ := c.Lookup("mean")
	cl, err := c.Closure(mean)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range cl {
		names = append(names, e.Name)
	}
	if !reflect.DeepEqual(names, []string{"mean", "numeric"}) {
		t.Fatalf("closure %v", names)
	}
	user := mustParse(t, "u.star", "load(\"mean\", \"reduce\")\nload(\"nosuch\", \"x\")\ndef run(params, inputs):\n    pass\n")
	_, err = c.Closure(user)
	d := wantDiag(t, err, diag.ForbiddenLoad)
	if d.Pos == nil || d.Pos.Line != 2 || d.Pos.Col != 1 {
		t.Fatalf("position %v", d.Pos)
	}
	ok := mustParse(t, "u.star", "load(\"mean\", \"reduce\")\ndef run(params, inputs):\n    pass\n")
	cl, err = c.Closure(ok)
	if err != nil || len(cl) != 3 || cl[0].Name != "mean" || cl[2].Name != "u" {
		t.Fatalf("transitive closure %v %v", cl, err)
	}
}

func TestOpenReportsEveryBrokenFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "good.star"), []byte("def run(params, inputs):\n    return 1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad1.star"), []byte("def run(:\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "grid.star"), []byte("def partition(params):\n    return []\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("ignored"), 0o644)
	c, err := Open(dir)
	ds, ok := diag.As(err)
	if !ok || len(ds) != 2 || ds[0].Code != diag.StarlarkSyntax || ds[1].Code != diag.CatalogDuplicate {
		t.Fatalf("Open errors: %v", err)
	}
	if _, ok := c.Lookup("good"); !ok {
		t.Fatal("a good file next to broken ones was not loaded")
	}
	if c2, err := Open(filepath.Join(dir, "nonexistent")); err != nil || c2 == nil {
		t.Fatalf("missing dir: %v", err)
	}
}

func TestStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "catalog")
	e := mustParse(t, "/elsewhere/mine.star", "def run(params, inputs):\n    return 1\n")
	if err := Store(dir, e); err != nil {
		t.Fatal(err)
	}
	if err := Store(dir, e); err != nil {
		t.Fatalf("storing the same entry twice: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "mine.star"))
	if err != nil || string(b) != string(e.Source) {
		t.Fatalf("stored %q, %v", b, err)
	}
	other := mustParse(t, "/x/mine.star", "def run(params, inputs):\n    return 2\n")
	wantDiag(t, Store(dir, other), diag.CatalogDuplicate)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}

// The built-in strategies are strategies, with the optional init and
// evaluate, and share the fl-common library; they load like any entry.
func TestBuiltinStrategies(t *testing.T) {
	c, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fedavg", "fedprox", "scaffold", "diloco", "fedbuff"} {
		e, ok := c.Lookup(name)
		if !ok {
			t.Fatalf("no built-in %s", name)
		}
		if e.Kind != Strategy || !e.HasFunc("init") || !e.HasFunc("evaluate") || !strings.HasPrefix(e.Doc, name+": ") {
			t.Errorf("%s: kind %s, funcs %v, doc %.30q", name, e.Kind, e.Funcs, e.Doc)
		}
		deps, err := c.Closure(e)
		if err != nil {
			t.Fatal(err)
		}
		if len(deps) != 2 || !slices.ContainsFunc(deps, func(d *Entry) bool { return d.Name == "fl-common" && d.Kind == Library }) {
			t.Errorf("%s loads %v", name, deps)
		}
	}
}

// CheckStrategy holds a strategy to the signatures the engine calls, which
// Parse (deducing only the kind) does not.
func TestCheckStrategy(t *testing.T) {
	const steps = "def client_step(g, data, params, state):\n    pass\ndef server_step(g, total, weight, params):\n    pass\n"
	for _, tc := range []struct {
		name, src string
		code      diag.Code
		line      int
	}{
		{"ok", steps, "", 0},
		{"optional ok", steps + "def init(params, dims):\n    pass\ndef evaluate(g, data, params=None):\n    pass\n", "", 0},
		{"client arity", "def client_step(g, data, state):\n    pass\ndef server_step(g, total, weight, params):\n    pass\n", diag.MissingFunction, 1},
		{"server arity", "def client_step(g, data, params, state):\n    pass\ndef server_step(g, updates):\n    pass\n", diag.MissingFunction, 3},
		{"init arity", steps + "def init(params):\n    pass\n", diag.MissingFunction, 5},
		{"evaluate arity", steps + "def evaluate(g):\n    pass\n", diag.MissingFunction, 5},
		{"not a strategy", "def reduce(results, params):\n    pass\n", diag.ContentKind, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckStrategy(mustParse(t, "s.star", tc.src))
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			d := wantDiag(t, err, tc.code)
			if tc.line > 0 && (d.Pos == nil || d.Pos.Line != tc.line || d.Source == "") {
				t.Fatalf("position %v, want line %d: %s", d.Pos, tc.line, d.Error())
			}
		})
	}
	// A library may define functions named init or evaluate freely.
	if e := mustParse(t, "lib.star", "def init(a, b, c):\n    pass\n"); e.Kind != Library {
		t.Fatalf("kind %s", e.Kind)
	}
}

// BuiltinLazy holds what Builtin holds: every entry, found by name and by
// ref, equal to Builtin's, listed alike; a user entry under a built-in's
// name is refused unless it is the same bytes; and a user entry with a
// built-in's bytes under another name does not take the built-in's ref.
// An entry is parsed only when it is needed.
func TestBuiltinLazyMatchesBuiltin(t *testing.T) {
	eager, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	lazy, err := BuiltinLazy()
	if err != nil {
		t.Fatal(err)
	}
	all := eager.List()
	first := all[0]
	if e, ok := lazy.Lookup(string(first.Ref)); !ok || !reflect.DeepEqual(e, first) {
		t.Fatalf("by ref: %v %v", e, ok)
	}
	if len(lazy.byName) != 1 || len(lazy.pending) != len(all)-1 {
		t.Fatalf("one lookup parsed %d entries (%d left pending)", len(lazy.byName), len(lazy.pending))
	}
	for _, e := range all {
		for _, key := range []string{e.Name, string(e.Ref)} {
			want, _ := eager.Lookup(key)
			got, ok := lazy.Lookup(key)
			if !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("Lookup(%s): lazy %v %v, eager %v", key, got, ok, want)
			}
		}
	}
	if _, ok := lazy.Lookup("no-such-entry"); ok {
		t.Error("an unknown name was found")
	}

	// Add, List and Closure on a fresh lazy catalog.
	lazy, _ = BuiltinLazy()
	clash := mustParse(t, "u/"+first.Name+".star", string(first.Source)+"\n# changed\n")
	wantDiag(t, lazy.Add(clash), diag.CatalogDuplicate)
	same := mustParse(t, "u/"+all[1].Name+".star", string(all[1].Source))
	if err := lazy.Add(same); err != nil {
		t.Fatalf("the same bytes under the built-in's name: %v", err)
	}
	twin := mustParse(t, "u/twin.star", string(all[2].Source))
	if err := lazy.Add(twin); err != nil {
		t.Fatal(err)
	}
	if e, _ := lazy.Lookup(string(twin.Ref)); e == nil || e.Name != all[2].Name {
		t.Errorf("by ref, a user twin shadowed the built-in: %v", e)
	}
	list := lazy.List()
	if len(list) != len(all)+1 {
		t.Fatalf("List: %d entries, want %d", len(list), len(all)+1)
	}
	for _, e := range list {
		if e.Name == "twin" {
			continue
		}
		if want, _ := eager.Lookup(e.Name); !reflect.DeepEqual(e, want) {
			t.Errorf("List: %s differs from Builtin's", e.Name)
		}
	}
}
