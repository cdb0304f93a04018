package trainer_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trainer"
)

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func code(err error) diag.Code {
	if ds, ok := diag.As(err); ok {
		return ds[0].Code
	}
	return ""
}

// A trainer's hash covers its files and nothing else: dot-files and
// __pycache__ are left out, a changed byte changes it, and the shipped
// bundle decodes to the same files.
func TestBundleHash(t *testing.T) {
	files := map[string]string{"train.py": "print(1)\n", "lib/model.py": "X = 1\n", ".git/HEAD": "ref\n", "__pycache__/model.pyc": "junk", ".env": "SECRET=1\n"}
	b, err := trainer.Load(writeDir(t, files))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range b.Files {
		paths = append(paths, f.Path)
	}
	if !slices.Equal(paths, []string{"lib/model.py", "train.py"}) || b.Entry != "train.py" {
		t.Fatalf("files %v, entry %s", paths, b.Entry)
	}
	ref, _ := b.Ref()
	raw, _ := b.Encode()
	if content.Hash(raw) != ref {
		t.Fatal("the bundle's ref is not the hash of its encoding")
	}
	back, err := trainer.Decode(raw)
	if err != nil || len(back.Files) != 2 || string(back.Files[1].Data) != "print(1)\n" {
		t.Fatalf("decoded %+v %v", back, err)
	}
	files["lib/model.py"] = "X = 2\n"
	b2, _ := trainer.Load(writeDir(t, files))
	if ref2, _ := b2.Ref(); ref2 == ref {
		t.Fatal("a changed file left the hash as it was")
	}
	// trainer.json names another entry point.
	b3, err := trainer.Load(writeDir(t, map[string]string{"main.py": "", "trainer.json": `{"entry": "main.py"}`}))
	if err != nil || b3.Entry != "main.py" {
		t.Fatalf("trainer.json entry: %+v %v", b3, err)
	}
}

// What cannot be a trainer is SC9501: no entry point, a symbolic link, an
// unsafe path in a shipped bundle, initial weights that disagree with
// their layout.
func TestBundleRefuses(t *testing.T) {
	if _, err := trainer.Load(writeDir(t, map[string]string{"model.py": ""})); code(err) != diag.TrainerBad {
		t.Fatalf("no train.py: %v", err)
	}
	dir := writeDir(t, map[string]string{"train.py": ""})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "data.csv")); err != nil {
		t.Fatal(err)
	}
	if _, err := trainer.Load(dir); code(err) != diag.TrainerBad {
		t.Fatalf("a symbolic link: %v", err)
	}
	evil := trainer.Bundle{Format: trainer.Format, Entry: "train.py", Files: []trainer.File{{Path: "../x.py"}, {Path: "train.py"}}}
	raw, _ := content.Encode(evil)
	if _, err := trainer.Decode(raw); code(err) != diag.TrainerBad {
		t.Fatalf("a path out of the directory: %v", err)
	}
	b, err := trainer.Load(writeDir(t, map[string]string{"train.py": "", "init.npy": string(trainer.EncodeNPY([]float64{1, 2, 3})),
		"layout.json": `[{"name": "w", "shape": [2, 2]}]`}))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Init(); code(err) != diag.TrainerBad {
		t.Fatalf("3 weights for a layout of 4: %v", err)
	}
}

// .npy as numpy writes it: float64 round trips; float32 (numpy's default
// for torch tensors) and any shape are read flat; other dtypes, Fortran
// order and truncated data are refused.
func TestNPY(t *testing.T) {
	v := []float64{1.5, -2, math.Pi, 0}
	got, shape, err := trainer.DecodeNPY(trainer.EncodeNPY(v))
	if err != nil || !slices.Equal(got, v) || !slices.Equal(shape, []int{4}) {
		t.Fatalf("round trip %v %v %v", got, shape, err)
	}
	npy := func(header string, data []byte) []byte {
		h := header
		for (10+len(h)+1)%64 != 0 {
			h += " "
		}
		h += "\n"
		b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8))
		return append(append(b, h...), data...)
	}
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(0.5))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-3))
	got, shape, err = trainer.DecodeNPY(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }", f32))
	if err != nil || !slices.Equal(got, []float64{0.5, -3}) || !slices.Equal(shape, []int{1, 2}) {
		t.Fatalf("float32 %v %v %v", got, shape, err)
	}
	for name, b := range map[string][]byte{
		"int64":     npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", make([]byte, 8)),
		"fortran":   npy("{'descr': '<f8', 'fortran_order': True, 'shape': (1,), }", make([]byte, 8)),
		"truncated": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", make([]byte, 8)),
		"not npy":   []byte("hello"),
	} {
		if _, _, err := trainer.DecodeNPY(b); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
}
