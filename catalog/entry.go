package catalog

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"go.starlark.net/resolve"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Kind is what an entry is for, deduced from its top-level defs.
type Kind string

const (
	Program     Kind = "program"     // defines run(params, inputs), optionally cost(params), compare(a, b, tolerance), verify(params, inputs, result, k)
	Partitioner Kind = "partitioner" // defines partition(params)
	Reducer     Kind = "reducer"     // defines reduce(results, params)
	Strategy    Kind = "strategy"    // defines client_step and server_step, optionally init and evaluate
	Topology    Kind = "topology"    // defines topology(members, params): the pool's tree of coordinator clusters
	Library     Kind = "library"     // defines helpers only, for load()
)

// Entry is one piece of content. Entries are immutable once added to a
// Catalog: do not modify their fields.
type Entry struct {
	Name   string
	Kind   Kind
	Ref    content.Ref // content.Hash(Source)
	Source []byte
	// Path locates the source for diagnostics: "builtin/grid.star" for a
	// built-in entry, the path the user gave for a user file.
	Path  string
	Doc   string   // the module docstring, "" if none
	Loads []string // modules named in load() statements, in order, without duplicates
	Funcs []string // top-level def names, sorted

	loads []loadSite // positions of the load statements, for Closure's diagnostics
}

type loadSite struct {
	module    string
	line, col int
}

// Subject names the entry in diagnostics: "program montecarlo-pi".
func (e *Entry) Subject() string { return string(e.Kind) + " " + e.Name }

// HasFunc reports whether the entry defines a top-level function name.
func (e *Entry) HasFunc(name string) bool {
	i := sort.SearchStrings(e.Funcs, name)
	return i < len(e.Funcs) && e.Funcs[i] == name
}

// SourceLine returns line n (1-based) of the source, or "".
func (e *Entry) SourceLine(n int) string {
	if n < 1 {
		return ""
	}
	lines := strings.SplitN(string(e.Source), "\n", n+1)
	if n > len(lines) {
		return ""
	}
	return strings.TrimRight(lines[n-1], "\r")
}

// Dialect returns the Starlark dialect content is written in: the standard
// language with set() allowed; no while loops, no top-level control flow, no
// global reassignment, no recursion. The sandbox executes with exactly
// these options, so what Parse accepts resolves the same way at run time.
func Dialect() *syntax.FileOptions {
	return &syntax.FileOptions{Set: true}
}

// role is a function whose presence gives an entry its kind, with the
// positional arity the engine calls it with.
type role struct {
	fn    string
	kind  Kind
	arity int // -1: not checked
	usage string
}

// roles lists the role functions. Kinds are decided here and only here.
var roles = []role{
	{"run", Program, 2, "run(params, inputs)"},
	{"cost", Program, 1, "cost(params)"},
	// A program that can be verified other than by byte equality says so:
	// compare judges two results within a tolerance (the convergent
	// tier), verify checks one result cheaply (Freivalds for products).
	{"compare", Program, 3, "compare(a, b, tolerance)"},
	{"verify", Program, 4, "verify(params, inputs, result, k)"},
	{"partition", Partitioner, 1, "partition(params)"},
	{"reduce", Reducer, 2, "reduce(results, params)"},
	// A strategy's signatures are checked by CheckStrategy when it is
	// loaded to run, not here: parsing stays as permissive as it was.
	{"client_step", Strategy, -1, "client_step(...)"},
	{"server_step", Strategy, -1, "server_step(...)"},
	// A topology lays the pool out: which coordinator cluster leads which
	// members (package topology validates what it returns).
	{"topology", Topology, 2, "topology(members, params)"},
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// NameFromPath returns the entry name for a file: its base name without
// the .star extension.
func NameFromPath(path string) string {
	return strings.TrimSuffix(filepath.Base(filepath.ToSlash(path)), ".star")
}

// Parse reads one Starlark file into an Entry: it parses and resolves the
// source in the content dialect, deduces the kind from the top-level defs
// and checks the arity of the role functions. It is the one loading function:
// built-in entries and user files both go through it. Errors are
// diagnostics positioned at path:line:col (diag.StarlarkSyntax for syntax
// and resolution errors, diag.ContentKind for an ambiguous kind,
// diag.MissingFunction for a role function with the wrong parameters,
// diag.InvalidValue for a file name that cannot be an entry name).
func Parse(path string, src []byte) (*Entry, error) {
	name := NameFromPath(path)
	if !nameRE.MatchString(name) {
		return nil, diag.New(diag.InvalidValue, path, "%q cannot name a catalog entry", name).At(path, 0, 0).
			WithHelp("name the file with letters, digits, '.', '-' or '_', ending in .star (for example my-reducer.star)")
	}
	e := &Entry{Name: name, Path: path, Source: append([]byte(nil), src...), Ref: content.Hash(src)}
	f, err := Dialect().Parse(path, src, 0)
	if err != nil {
		return nil, syntaxDiag(e, err)
	}
	// Resolve now, with every free name allowed (the sandbox's native
	// modules are not known here), so that dialect errors — a top-level
	// for, a while loop, a reassigned global — surface when the file is
	// added, not when a job first runs it.
	if err := resolve.File(f, func(string) bool { return true }, starlark.Universe.Has); err != nil {
		return nil, syntaxDiag(e, err)
	}
	defs := map[string]*syntax.DefStmt{}
	seenLoad := map[string]bool{}
	for i, stmt := range f.Stmts {
		switch s := stmt.(type) {
		case *syntax.ExprStmt:
			if lit, ok := s.X.(*syntax.Literal); ok && i == 0 && lit.Token == syntax.STRING {
				e.Doc, _ = lit.Value.(string)
			}
		case *syntax.DefStmt:
			defs[s.Name.Name] = s
			e.Funcs = append(e.Funcs, s.Name.Name)
		case *syntax.LoadStmt:
			mod, _ := s.Module.Value.(string)
			e.loads = append(e.loads, loadSite{mod, int(s.Load.Line), int(s.Load.Col)})
			if !seenLoad[mod] {
				seenLoad[mod] = true
				e.Loads = append(e.Loads, mod)
			}
		}
	}
	sort.Strings(e.Funcs)
	e.Doc = strings.TrimSpace(e.Doc)
	if err := e.deduceKind(defs); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Entry) deduceKind(defs map[string]*syntax.DefStmt) error {
	var found []string // role functions present, in roles order
	kinds := map[Kind]bool{}
	var diags diag.List
	for _, r := range roles {
		d, ok := defs[r.fn]
		if !ok {
			continue
		}
		found = append(found, r.fn)
		kinds[r.kind] = true
		if r.arity >= 0 && !acceptsPositional(d, r.arity) {
			diags = append(diags, diag.New(diag.MissingFunction, e.Name,
				"%s must accept %d positional parameter(s): the engine calls %s", r.fn, r.arity, r.usage).
				At(e.Path, int(d.Def.Line), int(d.Def.Col)).WithSource(e.SourceLine(int(d.Def.Line))).
				WithHelp("define it as def %s", r.usage))
		}
	}
	if len(kinds) > 1 {
		return diag.New(diag.ContentKind, e.Name, "defines %s: one file must have one kind", strings.Join(found, ", ")).
			At(e.Path, 0, 0).
			WithHelp("a program defines run (and optionally cost), a partitioner partition, a reducer reduce, a strategy client_step and server_step, a topology topology; move the others to their own files")
	}
	switch {
	case len(kinds) == 0:
		e.Kind = Library
	case kinds[Strategy]:
		for _, fn := range []string{"client_step", "server_step"} {
			if _, ok := defs[fn]; !ok {
				return diag.New(diag.MissingFunction, e.Name, "a strategy defines both client_step and server_step; %s is missing", fn).
					At(e.Path, 0, 0).WithHelp("add def %s(...)", fn)
			}
		}
		e.Kind = Strategy
	case kinds[Program]:
		if _, ok := defs["run"]; !ok {
			fn := found[0]
			d := defs[fn]
			return diag.New(diag.MissingFunction, e.Name, "defines %s but not run: a program needs run(params, inputs)", fn).
				At(e.Path, int(d.Def.Line), int(d.Def.Col)).WithSource(e.SourceLine(int(d.Def.Line))).
				WithHelp("add def run(params, inputs)")
		}
		e.Kind = Program
	case kinds[Partitioner]:
		e.Kind = Partitioner
	case kinds[Reducer]:
		e.Kind = Reducer
	case kinds[Topology]:
		e.Kind = Topology
	}
	return diags.Err()
}

// acceptsPositional reports whether a def can be called with n positional
// arguments.
func acceptsPositional(d *syntax.DefStmt, n int) bool {
	required, total := 0, 0
	for _, p := range d.Params {
		switch p := p.(type) {
		case *syntax.Ident:
			required++
			total++
		case *syntax.BinaryExpr: // name=default
			total++
		case *syntax.UnaryExpr:
			if p.Op == syntax.STAR {
				if p.X != nil {
					return required <= n // *args takes the rest
				}
				return required == n && total == n // bare *: keyword-only after
			}
			// **kwargs: no effect on positional arity
		}
	}
	return required <= n && n <= total
}

func syntaxDiag(e *Entry, err error) error {
	var ds diag.List
	add := func(pos syntax.Position, msg string) {
		line, col := int(pos.Line), int(pos.Col)
		ds = append(ds, diag.New(diag.StarlarkSyntax, e.Name, "%s", msg).At(e.Path, line, col).
			WithSource(e.SourceLine(line)))
	}
	switch err := err.(type) {
	case syntax.Error:
		add(err.Pos, err.Msg)
	case resolve.ErrorList:
		for _, r := range err {
			add(r.Pos, r.Msg)
		}
	default:
		ds = append(ds, diag.New(diag.StarlarkSyntax, e.Name, "%v", err).At(e.Path, 0, 0))
	}
	if len(ds) == 1 {
		return ds[0]
	}
	return ds
}

// String describes the entry for debugging.
func (e *Entry) String() string { return fmt.Sprintf("%s %s (%s)", e.Kind, e.Name, e.Ref.Short()) }
