package silo

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/content"
)

// saveState writes only what changes the file: no state and no file stays
// no file, the same state is not written again, another state is; what
// loadState reads back is always the last state saved.
func TestSaveStateWritesOnlyChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "state")
	if err := saveState(path, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("no state saved a file: %v", err)
	}
	if st, err := loadState(path); err != nil || st != nil {
		t.Fatalf("loadState of no state = %v, %v", st, err)
	}

	state := map[string]any{"c": []float64{1, 2}}
	if err := saveState(path, state); err != nil {
		t.Fatal(err)
	}
	first, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// The same state again: the file is left as it is (the same inode:
	// writeDurable would rename a new file over it).
	if err := saveState(path, map[string]any{"c": []float64{1, 2}}); err != nil {
		t.Fatal(err)
	}
	again, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(first, again) {
		t.Fatal("an unchanged state was written again")
	}
	// Another state, and then none: both written.
	if err := saveState(path, map[string]any{"c": []float64{3}}); err != nil {
		t.Fatal(err)
	}
	if st, err := loadState(path); err != nil || len(st["c"].([]float64)) != 1 {
		t.Fatalf("loadState after a change = %v, %v", st, err)
	}
	if err := saveState(path, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := loadState(path); err != nil || st != nil {
		t.Fatalf("loadState after saving no state over a state = %v, %v", st, err)
	}
}

// The run-blob cache holds what was put, and stays bounded.
func TestRunBlobsBounded(t *testing.T) {
	var c runBlobs
	for i := range 3 * maxRunBlobs {
		b := []byte{byte(i), byte(i >> 8)}
		c.put(content.Hash(b), b)
		if got, ok := c.get(content.Hash(b)); !ok || string(got) != string(b) {
			t.Fatalf("blob %d not cached", i)
		}
	}
	if len(c.m) > maxRunBlobs {
		t.Fatalf("%d blobs cached, the bound is %d", len(c.m), maxRunBlobs)
	}
}
