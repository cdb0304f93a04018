// Package blob is the content-addressed result store and its HTTP endpoint.
// It is deliberately separate from the coordinator API (law 3): result and
// model bytes live here, keyed by their hash, and the coordinator only ever
// handles the hashes. Invariant: a blob is stored only under the ref its
// bytes hash to, so a reader can always check what it received.
package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/scellis/scellis/content"
)

// ErrNotFound is returned by Get for a ref the store does not hold.
var ErrNotFound = errors.New("blob: not found")

// ErrHashMismatch is returned by Put when the bytes do not hash to the ref.
var ErrHashMismatch = errors.New("blob: bytes do not match their ref")

// ErrTooLarge is returned by Put when a blob exceeds the store's limit.
var ErrTooLarge = errors.New("blob: too large")

// Store keeps blobs in packs (small ones, pack.go) or as files named by
// their hash, written atomically.
type Store struct {
	dir     string
	maxSize int64
	packMax int64 // blobs up to this size are packed: PackThreshold (benchmarks: -1)
	// packRotate: a pack is closed after this many bytes (PackRotate;
	// tests lower it)
	packRotate int64

	mu         sync.Mutex
	queue      []*staged          // written, waiting for the next commit round
	pending    map[string]*staged // by final path: queued or in a round
	committing bool               // a Put is running commit rounds
	rounds     int                // commit rounds run (tests)
	// made holds the fan-out folders known to exist, so a Put skips the
	// mkdir system call (folders are never removed).
	made sync.Map

	// Packs (pack.go): pmu guards the index and the open packs; the
	// writer (w, wp, woff) belongs to the committer.
	pmu   sync.Mutex
	index map[[32]byte]packLoc // nil until first used
	packs map[string]*packFile // by path
	w     *os.File             // this store's pack being appended to
	wp    *packFile
	woff  int64
}

// DefaultMaxSize bounds one blob (a shard result or a model).
const DefaultMaxSize = 64 << 20

// Open returns a store in dir, creating it.
func Open(dir string, maxSize int64) (*Store, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Store{dir: dir, maxSize: maxSize, packMax: PackThreshold, packRotate: PackRotate}, nil
}

func (s *Store) path(ref content.Ref) (string, error) {
	if !content.IsRef(string(ref)) {
		return "", fmt.Errorf("blob: %q is not a ref", ref)
	}
	hexd := strings.TrimPrefix(string(ref), "sha256:")
	return filepath.Join(s.dir, hexd[:2], hexd), nil
}

// Put stores the bytes read from r under want, checking the hash and size.
// Storing a blob that is already present is a no-op. When Put returns nil
// the blob is durable: its bytes and its name survive a crash, so a hash
// reported after Put returns is never proposed for bytes that could be
// lost. Concurrent Puts share their fsyncs (group commit, see commit).
func (s *Store) Put(want content.Ref, r io.Reader) error {
	p, err := s.path(want)
	if err != nil {
		return err
	}
	// The same blob in a commit round counts as stored once the round
	// ends: its name may be visible before its folder is synced.
	if st := s.committingPath(p); st != nil {
		<-st.done
		if st.err == nil {
			_, err := io.Copy(io.Discard, io.LimitReader(r, s.maxSize+1))
			return err
		}
	}
	sum, _ := refSum(want)
	if s.stored(sum, p) {
		_, err = io.Copy(io.Discard, io.LimitReader(r, s.maxSize+1))
		return err
	}
	// A small blob goes to a pack: read it whole first.
	lim := min(s.packMax, s.maxSize)
	head, err := io.ReadAll(io.LimitReader(r, max(lim, 0)+1))
	if err != nil {
		return err
	}
	if int64(len(head)) <= lim {
		if sha256.Sum256(head) != sum {
			return ErrHashMismatch
		}
		return s.commit(&staged{data: head, sum: sum, path: p})
	}
	if int64(len(head)) > s.maxSize {
		return ErrTooLarge
	}
	r = io.MultiReader(bytes.NewReader(head), r)
	dir := filepath.Dir(p)
	if _, ok := s.made.Load(dir); !ok {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		s.made.Store(dir, true)
	}
	f, err := os.CreateTemp(dir, ".put-*")
	if err != nil {
		return err
	}
	fail := func(err error) error {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, s.maxSize+1))
	if err != nil {
		return fail(err)
	}
	if n > s.maxSize {
		return fail(ErrTooLarge)
	}
	if "sha256:"+hex.EncodeToString(h.Sum(nil)) != string(want) {
		return fail(ErrHashMismatch)
	}
	return s.commit(&staged{f: f, path: p})
}

// PutBytes stores b and returns its ref.
func (s *Store) PutBytes(b []byte) (content.Ref, error) {
	ref := content.Hash(b)
	return ref, s.Put(ref, bytes.NewReader(b)) // not a string: no copy of b
}

// PutBatch stores every blob in bs side by side, so one commit round's
// fsyncs cover them (group commit), and returns their refs in order. It
// returns once all are durable, or the first error.
func (s *Store) PutBatch(bs [][]byte) ([]content.Ref, error) {
	refs := make([]content.Ref, len(bs))
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		refs[i] = content.Hash(b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Put(refs[i], bytes.NewReader(b))
		}()
	}
	wg.Wait()
	return refs, errors.Join(errs...)
}

// refSum returns the sha256 a ref names.
func refSum(ref content.Ref) ([32]byte, bool) {
	var sum [32]byte
	b, err := hex.DecodeString(strings.TrimPrefix(string(ref), "sha256:"))
	if err != nil || len(b) != len(sum) {
		return sum, false
	}
	copy(sum[:], b)
	return sum, true
}

// stored reports whether the blob is in a pack or its file (without
// looking for packs written by others since the last scan).
func (s *Store) stored(sum [32]byte, path string) bool {
	if _, ok := s.packed(sum, false); ok {
		return true
	}
	_, err := os.Stat(path)
	return err == nil
}

// Get returns the bytes stored under ref.
func (s *Store) Get(ref content.Ref) ([]byte, error) {
	p, err := s.path(ref)
	if err != nil {
		return nil, err
	}
	sum, _ := refSum(ref)
	corrupt := false
	if l, ok := s.packed(sum, false); ok {
		if b, ok := readPacked(l, sum); ok {
			return b, nil
		}
		corrupt = true // a file copy may still be good
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		if l, ok := s.packed(sum, true); ok && !corrupt {
			if b, ok := readPacked(l, sum); ok {
				return b, nil
			}
			corrupt = true
		}
		if corrupt {
			return nil, fmt.Errorf("blob: %s is corrupt on disk", ref.Short())
		}
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	// A file damaged on disk must not be served as the blob.
	if content.Hash(b) != ref {
		return nil, fmt.Errorf("blob: %s is corrupt on disk", ref.Short())
	}
	return b, nil
}

// Open returns a reader of the blob ref and its length, for serving it
// without holding it in memory: a blob in its own file (larger than
// PackThreshold) is hashed from the file first, then read from the same
// open file, so a file damaged on disk is still refused; a packed blob
// (small) is read whole, as Get does. The caller closes the reader.
// Like Get, it answers ErrNotFound for a blob not stored.
func (s *Store) Open(ref content.Ref) (io.ReadCloser, int64, error) {
	p, err := s.path(ref)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		b, err := s.Get(ref) // packed, or absent
		if err != nil {
			return nil, 0, err
		}
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	}
	if err != nil {
		return nil, 0, err
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if sum, _ := refSum(ref); !bytes.Equal(h.Sum(nil), sum[:]) {
		f.Close()
		b, err := s.Get(ref) // a packed copy, or the refusal
		if err != nil {
			return nil, 0, err
		}
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	}
	return f, n, nil
}

// Has reports whether ref is stored.
func (s *Store) Has(ref content.Ref) bool {
	p, err := s.path(ref)
	if err != nil {
		return false
	}
	sum, _ := refSum(ref)
	if s.stored(sum, p) {
		return true
	}
	_, ok := s.packed(sum, true)
	return ok
}
