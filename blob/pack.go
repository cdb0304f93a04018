package blob

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// Packs. A small blob is not a file of its own: creating, fsyncing and
// renaming a file and fsyncing its folder costs a shard result more than
// everything else the pool does for it. Blobs of at most PackThreshold
// bytes that one commit round stores are appended to a pack file together
// — one write and one fsync for the whole round — and found again through
// an in-memory index (ref → pack, offset, length).
//
// Format: packs/<time>-<random>.pack, a sequence of entries
//
//	"SCPK" | length (uint32, big endian) | sha256 of the bytes (32) | the bytes
//
// with nothing else in the file. Each process writing to a store appends
// to packs it created itself (O_EXCL), so two processes sharing a store
// (the aggregator and its planning children) never interleave entries;
// a pack is rotated after PackRotate bytes.
//
// Durability: the pack's name is made durable (its folder fsync'd) before
// its first entry is acknowledged, and a round's entries are acknowledged
// only after the pack's fsync returns — the same guarantee as a file blob.
//
// Recovery: the index is rebuilt by scanning the packs when the store is
// first used, and rescanned for entries appended since (by another
// process) when a ref is not found. An entry is indexed only if its bytes
// hash to the sum it carries, so a torn tail (a crash mid-append) or a
// flipped byte makes that entry absent, never wrong. After a bad entry
// the scan resynchronises on the next "SCPK" whose entry checks, so
// damage in one entry loses nothing written after it. Acknowledged
// entries were fsync'd before a crash could tear anything after them.
// The store never deletes blobs, packed or not.

// PackThreshold is the largest blob stored in a pack; larger ones keep
// their own file.
const PackThreshold = 64 << 10

// PackRotate is the size after which a writer starts a new pack.
const PackRotate = 64 << 20

const entryHeader = 4 + 4 + sha256.Size

var packMagic = []byte("SCPK")

// packFile is one pack. Only this store's own packs stay open (r); others
// are opened for each scan or read, so a store of many packs does not
// hold a descriptor for each.
type packFile struct {
	name string
	r    atomic.Pointer[os.File] // own pack being written only
	size int64                   // the file's size at the last scan
	// scanned: entries before this offset are indexed (or were bad);
	// scanning resumes here when the file grows.
	scanned int64
	own     bool // written by this Store: indexed as written, never scanned
}

// packLoc is where a packed blob's bytes are.
type packLoc struct {
	p   *packFile
	off int64 // of the bytes, past the header
	n   int
}

func (s *Store) packDir() string { return filepath.Join(s.dir, "packs") }

// packed returns where the blob whose sha256 is sum is packed. The first
// call indexes every pack; rescan also scans what other processes
// appended since the last scan (a Get that found nothing else).
func (s *Store) packed(sum [32]byte, rescan bool) (packLoc, bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.index == nil {
		s.index = map[[32]byte]packLoc{}
		s.packs = map[string]*packFile{}
		s.scanPacks()
	} else if rescan {
		if _, ok := s.index[sum]; !ok {
			s.scanPacks()
		}
	}
	l, ok := s.index[sum]
	return l, ok
}

// readPacked returns l's bytes if they hash to sum.
func readPacked(l packLoc, sum [32]byte) ([]byte, bool) {
	b := make([]byte, l.n)
	read := func(r *os.File) bool {
		_, err := r.ReadAt(b, l.off)
		return err == nil && sha256.Sum256(b) == sum
	}
	// The open handle may be closed under this read (the pack was
	// rotated): then open the pack by name.
	if r := l.p.r.Load(); r != nil && read(r) {
		return b, true
	}
	r, err := os.Open(l.p.name)
	if err != nil {
		return nil, false
	}
	defer r.Close()
	return b, read(r)
}

// scanPacks indexes the entries of every pack written by others since the
// last scan. Called with pmu held.
func (s *Store) scanPacks() {
	ents, err := os.ReadDir(s.packDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".pack") {
			continue
		}
		name := filepath.Join(s.packDir(), e.Name())
		pf := s.packs[name]
		if pf == nil {
			pf = &packFile{name: name}
			s.packs[name] = pf
		}
		if pf.own {
			continue
		}
		info, err := e.Info()
		if err != nil || info.Size() == pf.size {
			continue
		}
		r, err := os.Open(name)
		if err != nil {
			continue
		}
		if fi, err := r.Stat(); err == nil {
			pf.size = fi.Size()
			s.scanPack(pf, r)
		}
		r.Close()
	}
}

// scanPack indexes pf's entries from pf.scanned to pf.size, a window at a
// time so a large pack is never read into memory at once.
func (s *Store) scanPack(pf *packFile, r *os.File) {
	const chunk = 1 << 20
	maxEntry := int64(entryHeader + PackThreshold)
	stuck := int64(-1) // the first entry that may still be being written
	at := pf.scanned   // the window's start: the next entry to look at
	for at < pf.size {
		end := min(at+chunk+maxEntry, pf.size)
		w := make([]byte, end-at)
		if _, err := r.ReadAt(w, at); err != nil {
			break // unreadable now: try again at the next scan
		}
		eof := end == pf.size
		limit := int64(len(w)) // entries starting before limit are parsed in this window
		if !eof {
			limit = chunk
		}
		pos := int64(0)
		for pos < limit {
			n, ok, incomplete := s.entryAt(pf, w, pos, at)
			if ok {
				pos += entryHeader + n
				continue
			}
			if incomplete && stuck < 0 {
				stuck = at + pos
			}
			// Bad or torn: resynchronise on the next magic.
			j := bytes.Index(w[pos+1:min(limit+int64(len(packMagic))-1, int64(len(w)))], packMagic)
			if j < 0 {
				if eof && stuck < 0 {
					stuck = at + pos // garbage up to the end: look again if the file grows
				}
				pos = limit
				break
			}
			pos += 1 + int64(j)
		}
		at += pos
		if eof {
			break
		}
	}
	pf.scanned = at
	if stuck >= 0 {
		pf.scanned = stuck
	}
}

// entryAt checks the entry at w[pos:] (the pack's offset base+pos) and
// indexes it if its bytes hash to its sum. incomplete: the entry runs
// past what was read, so it may still be being written (or was torn).
func (s *Store) entryAt(pf *packFile, w []byte, pos, base int64) (n int64, ok, incomplete bool) {
	rest := w[pos:]
	if len(rest) < entryHeader {
		return 0, false, bytes.HasPrefix(packMagic, rest[:min(len(rest), len(packMagic))])
	}
	if !bytes.Equal(rest[:4], packMagic) {
		return 0, false, false
	}
	n = int64(binary.BigEndian.Uint32(rest[4:8]))
	if n > PackThreshold {
		return 0, false, false
	}
	if int64(len(rest)) < entryHeader+n {
		return 0, false, base+pos+entryHeader+n > pf.size
	}
	var sum [32]byte
	copy(sum[:], rest[8:entryHeader])
	if sha256.Sum256(rest[entryHeader:entryHeader+n]) != sum {
		return 0, false, false
	}
	s.index[sum] = packLoc{p: pf, off: base + pos + entryHeader, n: int(n)}
	return n, true, false
}

// appendRound appends every blob of round to this store's pack with one
// write and one fsync, then indexes them. Only the committer calls it (one
// round at a time), so the writer needs no lock of its own.
func (s *Store) appendRound(round []*staged) {
	fail := func(err error) {
		for _, st := range round {
			st.err = err
		}
		// What the failed write or fsync left is not trusted: the next
		// round starts a new pack (a scan skips the damage).
		s.closeWriter()
	}
	if s.w == nil {
		if err := s.newPack(); err != nil {
			for _, st := range round {
				st.err = err
			}
			return
		}
	}
	size := 0
	for _, st := range round {
		size += entryHeader + len(st.data)
	}
	buf := make([]byte, 0, size)
	offs := make([]int64, len(round))
	for i, st := range round {
		offs[i] = s.woff + int64(len(buf)) + entryHeader
		buf = append(buf, packMagic...)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(st.data)))
		buf = append(buf, st.sum[:]...)
		buf = append(buf, st.data...)
	}
	if _, err := s.w.Write(buf); err != nil {
		fail(err)
		return
	}
	if err := s.w.Sync(); err != nil {
		fail(err)
		return
	}
	s.woff += int64(len(buf))
	s.pmu.Lock()
	for i, st := range round {
		s.index[st.sum] = packLoc{p: s.wp, off: offs[i], n: len(st.data)}
	}
	s.wp.size, s.wp.scanned = s.woff, s.woff
	s.pmu.Unlock()
	if s.woff >= s.packRotate {
		s.closeWriter()
	}
}

// closeWriter ends appends to this store's pack; its blobs are read by
// opening it by name from now on.
func (s *Store) closeWriter() {
	s.w.Close()
	if r := s.wp.r.Swap(nil); r != nil {
		r.Close()
	}
	s.w, s.wp = nil, nil
}

// newPack creates this store's next pack and makes its name durable.
func (s *Store) newPack() error {
	dir := s.packDir()
	if _, ok := s.made.Load(dir); !ok {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := syncDir(s.dir); err != nil {
			return err
		}
		s.made.Store(dir, true)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	name := filepath.Join(dir, fmt.Sprintf("%016x-%x.pack", time.Now().UnixNano(), rnd))
	w, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	r, err := os.Open(name)
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		w.Close()
		if r != nil {
			r.Close()
		}
		os.Remove(name)
		return err
	}
	pf := &packFile{name: name, own: true}
	pf.r.Store(r)
	s.packed([32]byte{}, false) // the index exists before the pack is in it
	s.pmu.Lock()
	s.packs[name] = pf
	s.pmu.Unlock()
	s.w, s.wp, s.woff = w, pf, 0
	return nil
}
