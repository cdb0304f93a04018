package blob

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
)

func TestPutGet(t *testing.T) {
	s, err := Open(t.TempDir(), 16)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := s.PutBytes([]byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Get(ref)
	if err != nil || string(b) != "hello" {
		t.Fatalf("get: %q %v", b, err)
	}
	if _, err := s.PutBytes([]byte("hello")); err != nil {
		t.Fatalf("re-put: %v", err)
	}
	if err := s.Put(content.Hash([]byte("x")), strings.NewReader("y")); !errors.Is(err, ErrHashMismatch) {
		t.Fatalf("mismatch accepted: %v", err)
	}
	big := bytes.Repeat([]byte("a"), 17)
	if err := s.Put(content.Hash(big), bytes.NewReader(big)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize accepted: %v", err)
	}
	if _, err := s.Get(content.Hash([]byte("nope"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := s.Get("sha256:../../etc/passwd"); err == nil {
		t.Fatal("path traversal accepted")
	}
}

// TestCorruptOnDiskNotServed: a file blob (above PackThreshold) changed on
// disk is refused, not served. (Packed blobs: pack_test.go.)
func TestCorruptOnDiskNotServed(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, 0)
	ref, _ := s.PutBytes(bytes.Repeat([]byte("result"), PackThreshold))
	p, _ := s.path(ref)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("a large blob is not in its own file: %v", err)
	}
	os.WriteFile(p, []byte("tampered"), 0o600)
	if _, err := s.Get(ref); err == nil {
		t.Fatal("corrupt blob served")
	}
	_ = filepath.Base(p)
}

// TestOpenStreams: Open reads a file blob (above PackThreshold) from its
// file and a packed one from its pack, both with their exact bytes; a
// missing blob is ErrNotFound and a file changed on disk is refused, as
// Get does (the blob endpoint serves GETs through Open).
func TestOpenStreams(t *testing.T) {
	s, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	large := bytes.Repeat([]byte("weights"), PackThreshold)
	for _, want := range [][]byte{large, []byte("small")} {
		ref, err := s.PutBytes(want)
		if err != nil {
			t.Fatal(err)
		}
		r, n, err := s.Open(ref)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || n != int64(len(want)) || !bytes.Equal(got, want) {
			t.Fatalf("Open of a %d-byte blob gave %d bytes (length %d): %v", len(want), len(got), n, err)
		}
	}
	if _, _, err := s.Open(content.Hash([]byte("nope"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	ref := content.Hash(large)
	p, _ := s.path(ref)
	if err := os.WriteFile(p, bytes.Repeat([]byte("tampered"), PackThreshold), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, _, err := s.Open(ref); err == nil {
		r.Close()
		t.Fatal("corrupt blob opened")
	}
}
