package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/scellis/scellis/content"
)

// entry is a pack entry's bytes, as appendRound writes them.
func entry(b []byte) []byte {
	sum := sha256.Sum256(b)
	out := append([]byte(nil), packMagic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(b)))
	out = append(out, sum[:]...)
	return append(out, b...)
}

func packsOf(t testing.TB, dir string) []string {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestPackCrashRecovery: small blobs land in one pack, not in files of
// their own; after a crash mid-append (a torn entry at the pack's end)
// and a flipped byte in one acknowledged entry's bytes and another's
// length, a reopened store serves every other acknowledged blob intact,
// refuses the damaged ones (never returns wrong bytes), and keeps
// storing.
func TestPackCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	var blobs [][]byte
	for i := range 30 {
		blobs = append(blobs, fmt.Appendf(nil, "result %d %s", i, bytes.Repeat([]byte{'x'}, i*7)))
	}
	refs, err := s.PutBatch(blobs[:20]) // concurrent Puts: one or few rounds
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blobs[20:] { // one round each
		r, err := s.PutBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	ps := packsOf(t, dir)
	if len(ps) != 1 {
		t.Fatalf("packs: %v; want one", ps)
	}
	if p, _ := s.path(refs[0]); fileExists(p) {
		t.Fatal("a small blob has a file of its own")
	}
	raw, err := os.ReadFile(ps[0])
	if err != nil {
		t.Fatal(err)
	}
	// A crash mid-append: half of an entry that was never acknowledged.
	torn := []byte("never acknowledged")
	f, err := os.OpenFile(ps[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(entry(torn)[:entryHeader+5])
	f.Close()
	// Disk damage: one byte of blob 5's bytes, and blob 12's length.
	at := func(i int) int {
		j := bytes.Index(raw, entry(blobs[i]))
		if j < 0 {
			t.Fatalf("blob %d not in the pack", i)
		}
		return j
	}
	flip := func(off int) {
		f, err := os.OpenFile(ps[0], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		f.ReadAt(b[:], int64(off))
		b[0] ^= 0x20
		f.WriteAt(b[:], int64(off))
		f.Close()
	}
	flip(at(5) + entryHeader + 3)
	flip(at(12) + 6)

	s2, err := Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, ref := range refs {
		b, err := s2.Get(ref)
		if i == 5 || i == 12 {
			if err == nil {
				t.Errorf("damaged blob %d served", i)
			}
			continue
		}
		if err != nil || !bytes.Equal(b, blobs[i]) {
			t.Errorf("blob %d after reopening: %q, %v", i, b, err)
		}
		if !s2.Has(ref) {
			t.Errorf("blob %d: Has false", i)
		}
	}
	if s2.Has(content.Hash(torn)) {
		t.Error("the torn entry is listed")
	}
	// The damaged blob can be stored again, and the store keeps working
	// in a new pack.
	if _, err := s2.PutBytes(blobs[5]); err != nil {
		t.Fatal(err)
	}
	more, err := s2.PutBytes([]byte("after the crash"))
	if err != nil {
		t.Fatal(err)
	}
	s3, _ := Open(dir, 0)
	for _, r := range []content.Ref{refs[0], refs[29], more} {
		if _, err := s3.Get(r); err != nil {
			t.Errorf("after a second reopening: %v", err)
		}
	}
	if len(packsOf(t, dir)) != 2 {
		t.Errorf("packs: %v; want the damaged one and a new one", packsOf(t, dir))
	}
}

// TestPackSeenByOtherStore: a store open on the same folder (a planning
// child of the aggregator) finds blobs packed by another after it first
// looked, including an entry it first saw half-written.
func TestPackSeenByOtherStore(t *testing.T) {
	dir := t.TempDir()
	a, _ := Open(dir, 0)
	b, _ := Open(dir, 0)
	r1, err := a.PutBytes([]byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(r1); err != nil || string(got) != "one" {
		t.Fatalf("b.Get: %q %v", got, err)
	}
	r2, _ := a.PutBytes([]byte("two"))
	if !b.Has(r2) {
		t.Fatal("b does not see a blob packed after its first scan")
	}
	// A pack being written by a third writer: half an entry, then the rest.
	p := filepath.Join(dir, "packs", "0-third.pack")
	e := entry([]byte("three"))
	os.WriteFile(p, e[:entryHeader+2], 0o600)
	r3 := content.Hash([]byte("three"))
	if b.Has(r3) {
		t.Fatal("half an entry indexed")
	}
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(e[entryHeader+2:])
	f.Close()
	if got, err := b.Get(r3); err != nil || string(got) != "three" {
		t.Fatalf("completed entry: %q %v", got, err)
	}
}

// TestPackThreshold: blobs up to PackThreshold are packed, larger ones
// get their own file, both readable; a large blob that does not match
// its ref is refused like a small one.
func TestPackThreshold(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, 0)
	small := bytes.Repeat([]byte{'s'}, PackThreshold)
	large := bytes.Repeat([]byte{'l'}, PackThreshold+1)
	rs, err := s.PutBytes(small)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := s.PutBytes(large)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := s.path(rs); fileExists(p) {
		t.Error("a blob of PackThreshold bytes has its own file")
	}
	if p, _ := s.path(rl); !fileExists(p) {
		t.Error("a blob above PackThreshold has no file")
	}
	for _, r := range []content.Ref{rs, rl} {
		if _, err := s.Get(r); err != nil {
			t.Error(err)
		}
	}
	if err := s.Put(content.Hash([]byte("other")), bytes.NewReader(large)); err == nil {
		t.Error("large bytes accepted under another ref")
	}
}

// TestPackConcurrentPuts: many writers at once share commit rounds, and
// every blob each was told is stored is there after reopening.
func TestPackConcurrentPuts(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, 0)
	const writers, each = 8, 25
	var wg sync.WaitGroup
	refs := make([][]content.Ref, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r, err := s.PutBytes(fmt.Appendf(nil, "w%d-%d", w, i))
				if err != nil {
					t.Error(err)
					return
				}
				refs[w] = append(refs[w], r)
			}
		})
	}
	wg.Wait()
	if s.rounds >= writers*each {
		t.Errorf("%d Puts from %d writers took %d rounds; want them to share", writers*each, writers, s.rounds)
	}
	s2, _ := Open(dir, 0)
	for w := range writers {
		for i, r := range refs[w] {
			if b, err := s2.Get(r); err != nil || string(b) != fmt.Sprintf("w%d-%d", w, i) {
				t.Fatalf("w%d-%d: %q %v", w, i, b, err)
			}
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// BenchmarkPackOpen: what the first lookup of a freshly opened store costs
// when its packs hold b.N blobs of a shard result's size — the index is
// rebuilt by scanning them (a planning or reducing child pays this once
// per process). Reports the scan rate.
//
//	go test -run '^$' -bench PackOpen -benchtime 100000x ./blob/
func BenchmarkPackOpen(b *testing.B) {
	dir := b.TempDir()
	s, _ := Open(dir, 0)
	batch := make([][]byte, 0, 256)
	var last content.Ref
	for i := range b.N {
		batch = append(batch, fmt.Appendf(bytes.Repeat([]byte{'r'}, 200), "%d", i))
		if len(batch) == cap(batch) || i == b.N-1 {
			refs, err := s.PutBatch(batch)
			if err != nil {
				b.Fatal(err)
			}
			last, batch = refs[len(refs)-1], batch[:0]
		}
	}
	var size int64
	for _, p := range packsOf(b, dir) {
		fi, _ := os.Stat(p)
		size += fi.Size()
	}
	b.ResetTimer()
	s2, _ := Open(dir, 0)
	if _, err := s2.Get(last); err != nil {
		b.Fatal(err)
	}
	el := b.Elapsed().Seconds()
	b.ReportMetric(float64(size)/el/1e6, "MB/s")
	b.ReportMetric(el*1e3, "ms-first-get")
	b.ReportMetric(float64(size)/1e6, "MB-of-packs")
}

// TestPackRotation: a full pack is closed and a new one started; blobs of
// the closed one are still served (opened by name), while other
// goroutines read them across the rotation.
func TestPackRotation(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, 0)
	s.packRotate = 1 << 10
	var refs []content.Ref
	for i := range 40 {
		r, err := s.PutBytes(fmt.Appendf(bytes.Repeat([]byte{'p'}, 100), "%d", i))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
		var wg sync.WaitGroup
		for _, r := range refs[max(0, i-4):] {
			wg.Go(func() {
				if _, err := s.Get(r); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if n := len(packsOf(t, dir)); n < 4 {
		t.Fatalf("%d packs for 40 × 140 bytes rotated at 1 KiB", n)
	}
	for i, r := range refs {
		if b, err := s.Get(r); err != nil || !bytes.HasSuffix(b, fmt.Appendf(nil, "%d", i)) {
			t.Fatalf("blob %d: %q %v", i, b, err)
		}
	}
}
