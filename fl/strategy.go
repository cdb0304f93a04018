package fl

import (
	"maps"
	"strings"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
)

// Strategy is an aggregation strategy: a catalog entry of kind
// catalog.Strategy and the parameters of one run. Params is read-only once
// the Strategy is in use (calls may run concurrently); use With to overlay
// per-round values.
type Strategy struct {
	Entry  *catalog.Entry
	Params map[string]any
}

// Load resolves ref in c — a name, a sha256: ref, or a path to a .star file
// (relative paths resolve against baseDir), exactly as a job's content is
// resolved — and checks that it is a strategy (see NewStrategy) whose
// load()s the catalog can satisfy.
func Load(c *catalog.Catalog, ref, baseDir string, params map[string]any) (*Strategy, error) {
	e, err := c.Resolve(ref, baseDir)
	if err != nil {
		return nil, err
	}
	s, err := NewStrategy(e, params)
	if err != nil {
		return nil, err
	}
	if _, err := c.Closure(e); err != nil {
		return nil, err
	}
	return s, nil
}

// NewStrategy wraps an entry, checking that it is a strategy with the
// signatures the engine calls (catalog.CheckStrategy: diag.ContentKind,
// diag.MissingFunction). params may be nil.
func NewStrategy(e *catalog.Entry, params map[string]any) (*Strategy, error) {
	if err := catalog.CheckStrategy(e); err != nil {
		return nil, err
	}
	if params == nil {
		params = map[string]any{}
	}
	return &Strategy{Entry: e, Params: params}, nil
}

// With returns a copy of s whose params are s.Params overlaid with extra
// (the per-round values the engine sets: round, seed, work, sites,
// staleness). s is not modified.
func (s *Strategy) With(extra map[string]any) *Strategy {
	p := maps.Clone(s.Params)
	if p == nil {
		p = map[string]any{}
	}
	maps.Copy(p, extra)
	return &Strategy{Entry: s.Entry, Params: p}
}

// Subject names the strategy in diagnostics.
func (s *Strategy) Subject() string { return s.Entry.Subject() }

// defLine returns the line of "def fn(" in the entry's source, 0 if absent,
// to position contract diagnostics at the function that broke it.
func defLine(e *catalog.Entry, fn string) int {
	for i, line := range strings.Split(string(e.Source), "\n") {
		if strings.HasPrefix(line, "def "+fn+"(") {
			return i + 1
		}
	}
	return 0
}

// contract returns a diag.FLContract positioned at fn.
func contract(s *Strategy, fn, format string, args ...any) error {
	line := defLine(s.Entry, fn)
	return diag.New(diag.FLContract, s.Subject(), fn+" "+format, args...).
		At(s.Entry.Path, line, 0).WithSource(s.Entry.SourceLine(line)).
		WithHelp("see Strategies in docs/content.md for what %s must return", fn)
}
