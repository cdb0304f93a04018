package dp

import (
	"time"

	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/safefile"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/scellis/scellis/diag"
)

// This file holds the ledger's storage: the file lock, reading and scanning
// frames, durable appends, cutting a torn tail, and atomic creation.
//
// Lock ordering: Ledger.mu, then the flock on the ledger file. No other lock
// is taken while the flock is held. Writers hold LOCK_EX for the whole
// read-check-append-fsync of one charge; readers (Verify) hold LOCK_SH while
// they read, so they never see a write in progress. flock is per open file
// description: two Ledgers opened on one file in one process exclude each
// other just as two processes do. flock is reliable on local filesystems
// only; do not keep a ledger on NFS.

// readRange reads bytes [from, to) of f.
func readRange(f *os.File, from, to int64) ([]byte, error) {
	buf := make([]byte, to-from)
	if _, err := f.ReadAt(buf, from); err != nil && !(errors.Is(err, io.EOF) && len(buf) == 0) {
		return nil, fmt.Errorf("dp: reading %s: %w", f.Name(), err)
	}
	return buf, nil
}

// tornTail describes bytes after the last complete entry that do not form
// one: a write cut short by a crash or power loss.
type tornTail struct {
	Offset int64
	Bytes  int64
	Why    string
}

// VerifyError names the first entry that breaks a ledger's chain.
type VerifyError struct {
	Seq    uint64 // sequence number the bad entry has, or should have had
	Offset int64  // byte offset of its frame in the file
	Reason string
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("entry %d (byte %d): %s", e.Seq, e.Offset, e.Reason)
}

// scan applies the frames in data, which starts at file offset base, to c.
// It returns the offset just past the last applied frame and, when the bytes
// after it are a torn write, a description of them. A frame that is damaged
// but not torn, or an entry that does not extend the chain, is a
// *VerifyError; the entries before it stay applied.
func scan(c *chain, data []byte, base int64) (end int64, torn *tornTail, err error) {
	off := 0
	for {
		seq := uint64(len(c.entries))
		payload, size, res, why := nextFrame(data[off:], c.format)
		switch res {
		case frameEnd:
			return base + int64(off), nil, nil
		case frameTorn:
			return base + int64(off), &tornTail{Offset: base + int64(off), Bytes: int64(len(data) - off), Why: why}, nil
		case frameCorrupt:
			return base + int64(off), nil, &VerifyError{Seq: seq, Offset: base + int64(off), Reason: why}
		}
		e, derr := decodeRecord(payload)
		if derr != nil {
			return base + int64(off), nil, &VerifyError{Seq: seq, Offset: base + int64(off), Reason: derr.Error()}
		}
		if aerr := c.apply(e); aerr != nil {
			reason := aerr.Error()
			if d, ok := aerr.(*diag.Diagnostic); ok {
				reason = d.Message
			}
			return base + int64(off), nil, &VerifyError{Seq: seq, Offset: base + int64(off), Reason: reason}
		}
		off += size
	}
}

// checkMagic returns the format data's magic announces, or a diagnostic
// unless data starts with a ledger magic.
func checkMagic(path string, data []byte) (int, error) {
	v := formatOfMagic(data)
	if v == 0 {
		return 0, diag.New(diag.LedgerNotLedger, path, "file is not a Scellis privacy ledger").
			WithHelp("give the file `scellis ledger init` created; a ledger starts with %q (or %q, format 1)", fileMagic, fileMagicV1)
	}
	return v, nil
}

// cutTail saves the torn bytes next to the ledger (path.torn-OFFSET, for
// forensics; nothing is destroyed silently), then truncates the ledger to
// the end of its last complete entry and syncs it.
func cutTail(f *os.File, path string, t *tornTail) error {
	data, err := readRange(f, t.Offset, t.Offset+t.Bytes)
	if err != nil {
		return err
	}
	side := fmt.Sprintf("%s.torn-%d", path, t.Offset)
	if err := os.WriteFile(side, data, 0o600); err != nil {
		return fmt.Errorf("dp: saving torn tail: %w", err)
	}
	if err := f.Truncate(t.Offset); err != nil {
		return fmt.Errorf("dp: cutting torn tail: %w", err)
	}
	return f.Sync()
}

// createFile atomically creates path holding data: it writes and syncs a
// temporary file in the same directory, then hard-links it into place (which
// fails if path exists), so a crash never leaves a half-written ledger.
func createFile(path string, data []byte) error {
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := path + ".tmp-" + hex.EncodeToString(rnd[:])
	if err := writeNewFile(tmp, data, 0o600); err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return err
	}
	return syncDir(path)
}

// syncDir fsyncs the directory holding path, so a new name survives a crash.
func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// RepairResult says what Repair did.
type RepairResult struct {
	// Reframed are the byte offsets of the frames whose framing (length,
	// its checksum or the CRC) was rewritten around an intact entry.
	Reframed []int64
	// SavedAs is where the damaged file was kept.
	SavedAs string
	// Entries is the number of entries of the repaired ledger.
	Entries int
}

// Repair rewrites the framing of a ledger whose damage is in the frames
// only: every frame that fails to parse must still hold, right after its
// header, a complete entry that extends the chain (hash, signature and
// budgets as Verify checks them). Such a frame is re-framed around the
// same bytes, so no signed entry is dropped and no spent ε decreases. A
// ledger with damaged entries is refused (SC5014): restore it from a copy
// (docs/dp.md, "A damaged ledger"). The damaged file is kept as
// path.damaged-UNIXNANO; the repaired one replaces it atomically. Repair
// needs no key: framing is not signed.
func Repair(path string, now time.Time) (*RepairResult, error) {
	f, _, err := safefile.Open(path, os.O_RDWR, safefile.MaxLedger)
	if err != nil {
		return nil, openDiag(path, err)
	}
	defer f.Close()
	unlock, err := lockFile(f, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, diag.New(diag.LedgerNotLedger, path, "is not a regular file")
	}
	data, err := readRange(f, 0, fi.Size())
	if err != nil {
		return nil, err
	}
	v, err := checkMagic(path, data)
	if err != nil {
		return nil, err
	}
	res := &RepairResult{}
	c := newChain(v)
	out := []byte(magicOf(v))
	hs := headerSize(v)
	off := len(fileMagic)
	unrepairable := func(why string) error {
		return diag.New(diag.LedgerCorrupt, path, "entry %d (byte %d) cannot be repaired: %s", len(c.entries), off, why).
			WithHelp("the damage is in the entry itself, not its framing: restore the ledger from a copy and check it with `scellis ledger audit` (docs/dp.md, \"A damaged ledger\")")
	}
	for off < len(data) {
		payload, size, fr, why := nextFrame(data[off:], v)
		switch fr {
		case frameTorn:
			out = append(out, data[off:]...) // a crash's leftovers: the next writer cuts them
			off = len(data)
			continue
		case frameOK:
		default:
			if len(data)-off <= hs {
				return nil, unrepairable(why)
			}
			rest, derr := content.DecodeFirst(data[off+hs:])
			if derr != nil {
				return nil, unrepairable(why)
			}
			payload = data[off+hs : len(data)-len(rest)]
			size = min(len(data)-off, hs+len(payload)+4)
			res.Reframed = append(res.Reframed, int64(off))
		}
		e, derr := decodeRecord(payload)
		if derr != nil {
			return nil, unrepairable(derr.Error())
		}
		if aerr := c.apply(e); aerr != nil {
			return nil, unrepairable(aerr.Error())
		}
		out = appendFrame(out, payload, v)
		off += size
	}
	res.Entries = len(c.entries)
	if len(res.Reframed) == 0 {
		return res, nil
	}
	if _, err := verifyBytes(path, out, nil); err != nil {
		return nil, fmt.Errorf("dp: the repaired ledger does not verify: %w", err)
	}
	res.SavedAs = fmt.Sprintf("%s.damaged-%d", path, now.UnixNano())
	if err := writeNewFile(res.SavedAs, data, 0o600); err != nil {
		return nil, fmt.Errorf("dp: keeping the damaged ledger: %w", err)
	}
	tmp := fmt.Sprintf("%s.repair-%d", path, now.UnixNano())
	if err := writeNewFile(tmp, out, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	return res, syncDir(path)
}
