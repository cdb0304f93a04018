package catalog

import (
	"io/fs"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Content files reach a peer from other people; Parse must never panic, and
// whatever it accepts must be a consistent entry.
func FuzzParse(f *testing.F) {
	files, _ := fs.Glob(builtinFS, "builtin/*.star")
	if len(files) == 0 {
		f.Fatal("no seed corpus: the built-in files vanished")
	}
	for _, name := range files {
		src, _ := builtinFS.ReadFile(name)
		f.Add(src)
	}
	f.Add([]byte("def run(params, inputs):\n    return (1 +\n"))
	f.Add([]byte("load(\"x\", \"y\")\ndef client_step(a):\n    pass\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		e, err := Parse("fuzz.star", src)
		if err != nil {
			if _, ok := diag.As(err); !ok {
				t.Fatalf("Parse returned a non-diagnostic error: %v", err)
			}
			return
		}
		if e.Ref != content.Hash(src) || string(e.Source) != string(src) {
			t.Fatal("entry does not carry its source and ref")
		}
		switch e.Kind {
		case Program, Partitioner, Reducer, Strategy, Topology, Library:
		default:
			t.Fatalf("kind %q", e.Kind)
		}
		if err := New().Add(e); err != nil {
			t.Fatal(err)
		}
	})
}
