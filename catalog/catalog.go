package catalog

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// MaxSourceBytes bounds a content file read from disk.
const MaxSourceBytes = 4 << 20

// Catalog holds entries by name and by ref. It is safe for concurrent use.
type Catalog struct {
	mu     sync.RWMutex
	byName map[string]*Entry
	byRef  map[content.Ref]*Entry
	// pending holds built-in sources not parsed yet (BuiltinLazy), by
	// name; pendingRef names the first of them (in BuiltinLazy's order)
	// with a given ref, the entry Lookup by that ref finds, as Builtin's
	// first-added entry wins.
	pending    map[string]pendingEntry
	pendingRef map[content.Ref]string
}

// pendingEntry is a source BuiltinLazy holds until it is looked up.
type pendingEntry struct {
	path string
	src  []byte
	ref  content.Ref
}

// New returns an empty catalog (no built-ins; see Builtin and Open).
func New() *Catalog {
	return &Catalog{byName: map[string]*Entry{}, byRef: map[content.Ref]*Entry{}}
}

// Add stores e. Adding the same source under the same name again is a no-op;
// a different source under a name already held is refused with
// diag.CatalogDuplicate, so a user file can never shadow a built-in. Entries
// are reachable by name and by ref (by ref, the first entry added with those
// bytes wins).
func (c *Catalog) Add(e *Entry) error {
	if e == nil || e.Name == "" {
		return errors.New("catalog: entry without a name")
	}
	if e.Ref != content.Hash(e.Source) {
		return fmt.Errorf("catalog: entry %s has ref %s, but its source hashes to %s", e.Name, e.Ref, content.Hash(e.Source))
	}
	c.materialize(e.Name) // a pending built-in of that name is held too
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byName[e.Name]; ok {
		if old.Ref == e.Ref {
			return nil
		}
		return diag.New(diag.CatalogDuplicate, e.Name, "%s (%s) differs from the catalog's %s %s (%s, from %s)",
			e.Path, e.Ref.Short(), old.Kind, old.Name, old.Ref.Short(), old.Path).
			WithHelp("rename the file to give the entry another name, or refer to the existing entry by its name")
	}
	c.byName[e.Name] = e
	if _, ok := c.byRef[e.Ref]; !ok && c.pendingRef[e.Ref] == "" {
		c.byRef[e.Ref] = e
	}
	return nil
}

// Lookup finds an entry by name or by ref.
func (c *Catalog) Lookup(nameOrRef string) (*Entry, bool) {
	c.mu.RLock()
	var e *Entry
	var ok bool
	name := nameOrRef
	if content.IsRef(nameOrRef) {
		e, ok = c.byRef[content.Ref(nameOrRef)]
		name = c.pendingRef[content.Ref(nameOrRef)]
	} else {
		e, ok = c.byName[nameOrRef]
	}
	_, pending := c.pending[name]
	c.mu.RUnlock()
	if ok || !pending {
		return e, ok
	}
	return c.materialize(name), true
}

// materialize parses the pending built-in name, if there is one, and
// holds it as Builtin would have; it returns the entry held under name.
func (c *Catalog) materialize(name string) *Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.pending[name]
	if !ok {
		return c.byName[name]
	}
	e, err := Parse(p.path, p.src)
	if err != nil {
		// Built-in sources are embedded in the binary and parsed by its
		// tests (TestBuiltinLazyMatchesBuiltin): a failure here is a
		// defect of the build, not of any input.
		panic(fmt.Sprintf("catalog: built-in %s does not parse: %v", p.path, err))
	}
	delete(c.pending, name)
	c.byName[name] = e
	if c.pendingRef[e.Ref] == name {
		delete(c.pendingRef, e.Ref)
		c.byRef[e.Ref] = e
	}
	return e
}

// List returns every entry, sorted by name.
func (c *Catalog) List() []*Entry {
	c.mu.RLock()
	var names []string
	for name := range c.pending {
		names = append(names, name)
	}
	c.mu.RUnlock()
	sort.Strings(names)
	for _, name := range names {
		c.materialize(name)
	}
	c.mu.RLock()
	out := make([]*Entry, 0, len(c.byName))
	for _, e := range c.byName {
		out = append(out, e)
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// IsPath reports whether a content reference names a file rather than a
// catalog entry: it contains a slash or ends in ".star".
func IsPath(s string) bool {
	return strings.Contains(s, "/") || strings.Contains(s, string(filepath.Separator)) || strings.HasSuffix(s, ".star")
}

// Resolve finds the entry a job or command refers to: a name, a sha256: ref,
// or a path (see IsPath; relative paths resolve against baseDir), which is
// read, parsed and added. Unknown names and refs are diag.UnknownContent with
// a hint; an unreadable path is diag.FileUnreadable.
func (c *Catalog) Resolve(s, baseDir string) (*Entry, error) {
	switch {
	case content.IsRef(s):
		if e, ok := c.Lookup(s); ok {
			return e, nil
		}
		return nil, diag.New(diag.UnknownContent, s, "no catalog entry has ref %s", s).
			WithHelp("scellis catalog ls lists the entries; add a file with scellis catalog add FILE")
	case strings.HasPrefix(s, "sha256:"):
		return nil, diag.New(diag.UnknownContent, s, "%q is not a well-formed ref", s).
			WithHelp("a ref is sha256: followed by 64 lower-case hex digits, as scellis catalog ls --json prints")
	case IsPath(s):
		path := s
		if !filepath.IsAbs(path) && baseDir != "" {
			path = filepath.Join(baseDir, path)
		}
		src, err := ReadSource(path)
		if err != nil {
			return nil, err
		}
		e, err := Parse(path, src)
		if err != nil {
			return nil, err
		}
		if err := c.Add(e); err != nil {
			return nil, err
		}
		return e, nil
	}
	if e, ok := c.Lookup(s); ok {
		return e, nil
	}
	d := diag.New(diag.UnknownContent, s, "the catalog has no entry named %q", s)
	if near := c.nearest(s); near != "" {
		return nil, d.WithHelp("did you mean %q? scellis catalog ls lists the entries; a file path needs a / or the .star extension", near)
	}
	return nil, d.WithHelp("scellis catalog ls lists the entries; a file path needs a / or the .star extension")
}

// ReadSource reads a content file, refusing files over MaxSourceBytes.
// Failures are diag.FileUnreadable.
func ReadSource(path string) ([]byte, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, math.MaxInt64) // size checked below
	if err != nil {
		return nil, unreadable(path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSourceBytes+1))
	if err != nil {
		return nil, unreadable(path, err)
	}
	if len(b) > MaxSourceBytes {
		return nil, diag.New(diag.FileUnreadable, path, "content file is larger than %d MiB", MaxSourceBytes>>20).
			WithHelp("content is code: keep data in inputs, not in the .star file")
	}
	return b, nil
}

func unreadable(path string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return diag.New(diag.FileUnreadable, path, "cannot read content file: %v", err).
		WithHelp("check the path (relative paths resolve against the job file's folder) and permissions")
}

// nearest returns the entry name closest to s, if any is close.
func (c *Catalog) nearest(s string) string {
	entries := c.List()
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name
	}
	return diag.Suggest(s, names)
}

// Closure returns e and every entry it loads, transitively, sorted by name
// (job IDs hash them). A load of a module the catalog lacks is
// diag.ForbiddenLoad at the load statement.
func (c *Catalog) Closure(e *Entry) ([]*Entry, error) {
	seen := map[content.Ref]*Entry{e.Ref: e}
	queue := []*Entry{e}
	var diags diag.List
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, site := range cur.sites() {
			dep, ok := c.Lookup(site.module)
			if !ok {
				diags = append(diags, diag.New(diag.ForbiddenLoad, cur.Name, "load(%q): no catalog entry has that name or ref", site.module).
					At(cur.Path, site.line, site.col).WithSource(cur.SourceLine(site.line)).
					WithHelp("load() only names catalog entries; add the file with scellis catalog add, then load it by name"))
				continue
			}
			if _, ok := seen[dep.Ref]; !ok {
				seen[dep.Ref] = dep
				queue = append(queue, dep)
			}
		}
	}
	if err := diags.Err(); err != nil {
		return nil, err
	}
	out := make([]*Entry, 0, len(seen))
	for _, d := range seen {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Ref < out[j].Ref
	})
	return out, nil
}

// sites returns the load statements of e; entries built by hand rather than
// by Parse have only Loads, without positions.
func (e *Entry) sites() []loadSite {
	if len(e.loads) > 0 || len(e.Loads) == 0 {
		return e.loads
	}
	s := make([]loadSite, len(e.Loads))
	for i, m := range e.Loads {
		s[i] = loadSite{module: m}
	}
	return s
}
