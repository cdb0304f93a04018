package catalog

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

//go:embed builtin/*.star
var builtinFS embed.FS

// Builtin returns a catalog holding every embedded builtin/*.star, each
// loaded by Parse and Add exactly like a user's file.
func Builtin() (*Catalog, error) {
	c := New()
	err := eachBuiltin(func(name string, src []byte) error {
		e, err := Parse(name, src)
		if err != nil {
			return err
		}
		return c.Add(e)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// eachBuiltin calls fn with every embedded builtin/*.star, in name order.
func eachBuiltin(fn func(name string, src []byte) error) error {
	files, err := fs.Glob(builtinFS, "builtin/*.star")
	if err != nil {
		return err
	}
	sort.Strings(files)
	for _, name := range files {
		src, err := builtinFS.ReadFile(name)
		if err != nil {
			return err
		}
		if err := fn(name, src); err != nil {
			return err
		}
	}
	return nil
}

// BuiltinLazy returns the catalog Builtin returns, except that an entry
// is parsed when it is first looked up (or listed, or added again), not
// before: for a process that reads a few entries once, such as a sandbox
// child planning or reducing one job (parsing every built-in costs a few
// milliseconds of CPU, most of a small plan's work). Entries, refs and
// refusals are Builtin's.
func BuiltinLazy() (*Catalog, error) {
	c := New()
	c.pending = map[string]pendingEntry{}
	c.pendingRef = map[content.Ref]string{}
	err := eachBuiltin(func(name string, src []byte) error {
		n := NameFromPath(name)
		if _, dup := c.pending[n]; dup {
			return fmt.Errorf("catalog: two built-ins named %s", n)
		}
		ref := content.Hash(src)
		c.pending[n] = pendingEntry{path: name, src: src, ref: ref}
		if _, ok := c.pendingRef[ref]; !ok {
			c.pendingRef[ref] = n
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Open returns the built-in catalog plus every *.star file in dir (the
// user's catalog, by default $SCELLIS_HOME/catalog). A missing dir is an
// empty user catalog. Every file that fails to load is reported (as a
// diag.List); the returned catalog then still holds every entry that did
// load, for callers that can carry on without the broken ones.
func Open(dir string) (*Catalog, error) {
	c, err := Builtin()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		return c, nil
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, unreadable(dir, err)
	}
	var diags diag.List
	for _, de := range ents { // ReadDir sorts by file name
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".star") {
			continue
		}
		path := filepath.Join(dir, de.Name())
		err := func() error {
			src, err := ReadSource(path)
			if err != nil {
				return err
			}
			e, err := Parse(path, src)
			if err != nil {
				return err
			}
			return c.Add(e)
		}()
		if err != nil {
			if ds, ok := diag.As(err); ok {
				diags = append(diags, ds...)
			} else {
				return c, err
			}
		}
	}
	return c, diags.Err()
}

// Store writes e's source into the user's catalog dir as NAME.star, creating
// dir if needed. Storing the same source again is a no-op; a different file
// of that name already there is diag.CatalogDuplicate. The write is atomic
// (temporary file, then rename).
func Store(dir string, e *Entry) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return unreadable(dir, err)
	}
	target := filepath.Join(dir, e.Name+".star")
	if old, err := os.ReadFile(target); err == nil {
		if string(old) == string(e.Source) {
			return nil
		}
		return diag.New(diag.CatalogDuplicate, e.Name, "%s already holds a different entry named %s", target, e.Name).
			WithHelp("rename your file, or remove %s first if you mean to replace it", target)
	}
	tmp, err := os.CreateTemp(dir, ".add-*.star.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(e.Source); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}
