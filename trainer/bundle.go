package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Format is the version of a trainer bundle and of its file protocol.
const Format = "scellis/trainer/v1"

// The files of a trainer directory the engine reads itself.
const (
	ManifestFile = "trainer.json" // optional: {"entry": "train.py"}
	DefaultEntry = "train.py"
	InitFile     = "init.npy"    // the initial weights, flat
	LayoutFile   = "layout.json" // [{"name", "shape"}] of init.npy
)

// Bounds on a trainer directory: it is code and a small initial model,
// shipped to every silo of a run.
const (
	MaxFiles = 1000
	MaxBytes = 64 << 20
)

// File is one file of a trainer, by its slash-separated path in the
// directory.
type File struct {
	Path string `cbor:"path" json:"path"`
	Data []byte `cbor:"data" json:"-"`
}

// Bundle is a trainer as it is hashed and shipped: its files, sorted by
// path, and its entry point.
type Bundle struct {
	Format string `cbor:"format" json:"format"`
	Entry  string `cbor:"entry" json:"entry"`
	Files  []File `cbor:"files" json:"files"`
}

// Tensor is one named tensor of a model's layout.
type Tensor struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// Size is the tensor's number of values.
func (t Tensor) Size() int {
	n := 1
	for _, k := range t.Shape {
		n *= k
	}
	return n
}

// Layout is a model's tensors in the order they are flattened.
type Layout []Tensor

// Size is the layout's number of values.
func (l Layout) Size() int {
	n := 0
	for _, t := range l {
		n += t.Size()
	}
	return n
}

func bad(subject, help, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.TrainerBad, subject, format, args...).WithHelp("%s", help)
}

// Load reads a trainer directory: every regular file except those whose
// name starts with "." and __pycache__ folders (never hashed, never
// shipped). A symbolic link, a special file or a directory beyond the
// bounds is refused (SC9501).
func Load(dir string) (*Bundle, error) {
	subject := "trainer " + dir
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return nil, bad(subject, "give the trainer's directory: its entry point (train.py), init.npy and layout.json", "%s is not a readable directory", dir)
	}
	b := &Bundle{Format: Format, Entry: DefaultEntry}
	total := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") || name == "__pycache__" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return bad(subject, "a trainer holds regular files only; copy the file in instead of linking it", "%s is not a regular file (%s)", rel, d.Type())
		}
		if len(b.Files) >= MaxFiles {
			return bad(subject, "ship code and a small initial model only; data stays in the silos", "more than %d files", MaxFiles)
		}
		data, err := safefile.ReadFile(p, MaxBytes)
		if err != nil {
			return err
		}
		if total += len(data); total > MaxBytes {
			return bad(subject, "ship code and a small initial model only; data stays in the silos", "more than %s of files", safefile.Size(MaxBytes))
		}
		b.Files = append(b.Files, File{Path: filepath.ToSlash(rel), Data: data})
		return nil
	})
	if err != nil {
		if _, ok := diag.As(err); ok {
			return nil, err
		}
		return nil, bad(subject, "check the trainer directory's files and permissions", "reading the trainer: %v", err)
	}
	slices.SortFunc(b.Files, func(x, y File) int { return strings.Compare(x.Path, y.Path) })
	if m, ok := b.File(ManifestFile); ok {
		var man struct {
			Entry string `json:"entry"`
		}
		dec := json.NewDecoder(strings.NewReader(string(m)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&man); err != nil {
			return nil, bad(subject, `trainer.json is optional; it holds {"entry": "FILE.py"}`, "%s: %v", ManifestFile, err)
		}
		if man.Entry != "" {
			b.Entry = man.Entry
		}
	}
	return b, b.Validate(subject)
}

// Validate checks the bundle's shape: safe relative paths, sorted and
// unique, an entry point that is one of its files. It does not require the
// initial weights (Init does).
func (b *Bundle) Validate(subject string) error {
	if b.Format != Format {
		return bad(subject, "build the trainer with this version of scellis", "trainer format %q, not %q", b.Format, Format)
	}
	for i, f := range b.Files {
		if !safePath(f.Path) {
			return bad(subject, "a trainer's files have relative paths inside its directory", "unsafe file path %q", f.Path)
		}
		if i > 0 && b.Files[i-1].Path >= f.Path {
			return bad(subject, "the bundle is not canonical", "files out of order or repeated at %q", f.Path)
		}
	}
	if _, ok := b.File(b.Entry); !ok {
		return bad(subject, "write the entry point train.py (or name it in trainer.json: {\"entry\": \"FILE.py\"})", "the entry point %s is not in the trainer", b.Entry)
	}
	return nil
}

func safePath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || !utf8.ValidString(p) || path.Clean(p) != p {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." || part == "." || strings.HasPrefix(part, ".") {
			return false
		}
	}
	return true
}

// File returns the bytes of the file at p.
func (b *Bundle) File(p string) ([]byte, bool) {
	i, ok := slices.BinarySearchFunc(b.Files, p, func(f File, p string) int { return strings.Compare(f.Path, p) })
	if !ok {
		return nil, false
	}
	return b.Files[i].Data, true
}

// Encode returns the bundle's canonical bytes, the blob a run ships.
func (b *Bundle) Encode() ([]byte, error) { return content.Encode(b) }

// Ref is the trainer's content hash: what a run names and a policy allows.
func (b *Bundle) Ref() (content.Ref, error) { return content.HashOf(b) }

// Decode reads a shipped bundle and checks it.
func Decode(raw []byte) (*Bundle, error) {
	var b Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, bad("trainer "+content.Hash(raw).Short(), "the blob is not a trainer bundle", "cannot decode the trainer: %v", err)
	}
	return &b, b.Validate("trainer " + content.Hash(raw).Short())
}

// Init returns the trainer's initial weights and their layout, checked
// against each other (SC9501 when missing or inconsistent).
func (b *Bundle) Init() ([]float64, Layout, error) {
	subject := "trainer " + b.Entry
	help := "run scellis trainer init DIR: it runs the trainer's init in the sandbox and writes init.npy and layout.json"
	raw, ok := b.File(InitFile)
	lraw, lok := b.File(LayoutFile)
	if !ok || !lok {
		return nil, nil, bad(subject, help, "the trainer has no initial weights (%s and %s)", InitFile, LayoutFile)
	}
	w, _, err := DecodeNPY(raw)
	if err != nil {
		return nil, nil, bad(subject, help, "%s: %v", InitFile, err)
	}
	layout, err := ParseLayout(lraw)
	if err != nil {
		return nil, nil, bad(subject, help, "%s: %v", LayoutFile, err)
	}
	if layout.Size() != len(w) {
		return nil, nil, bad(subject, help, "%s describes %d values, %s holds %d", LayoutFile, layout.Size(), InitFile, len(w))
	}
	if i := nonFinite(w); i >= 0 {
		return nil, nil, bad(subject, help, "%s holds %v at index %d", InitFile, w[i], i)
	}
	return w, layout, nil
}

// ParseLayout reads a layout.json.
func ParseLayout(raw []byte) (Layout, error) {
	var l Layout
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, errors.New("an empty layout")
	}
	n := 0
	for _, t := range l {
		if t.Name == "" {
			return nil, errors.New("a tensor without a name")
		}
		for _, k := range t.Shape {
			if k < 0 || k > 1<<27 {
				return nil, fmt.Errorf("tensor %s has dimension %d", t.Name, k)
			}
		}
		if n += t.Size(); n > 1<<27 {
			return nil, fmt.Errorf("more than %d values", 1<<27)
		}
	}
	return l, nil
}

// Unpack writes the bundle's files under dir (which must exist), read-only.
func (b *Bundle) Unpack(dir string) error {
	for _, f := range b.Files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.Data, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// nonFinite returns the index of the first NaN or infinity in v, or -1.
func nonFinite(v []float64) int {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return i
		}
	}
	return -1
}
