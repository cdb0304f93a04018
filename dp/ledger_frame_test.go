package dp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
)

// frameOffsets returns the file offset of every frame of an intact ledger.
func frameOffsets(t *testing.T, data []byte) []int {
	t.Helper()
	v := formatOfMagic(data)
	var offs []int
	off := len(fileMagic)
	for off < len(data) {
		_, size, res, why := nextFrame(data[off:], v)
		if res != frameOK {
			t.Fatalf("intact ledger does not parse at %d: %s", off, why)
		}
		offs = append(offs, off)
		off += size
	}
	return offs
}

// One flipped byte in an entry's length field must never read as a torn
// write: for every entry of a real ledger (written by Create and Charge, in
// both formats), every byte of its length field (and, in format 2, of the
// length's checksum) flipped in five ways is reported at that entry's
// offset; the writer refuses to open the ledger (fenced), cuts nothing, and
// the spent ε a writer would start from never drops.
func TestLedgerLengthFieldFlipsAreCorruption(t *testing.T) {
	// A low bit (the length shrinks or grows a little: the CRC lands
	// elsewhere), middle and high bits (the frame claims more than the
	// file holds: the refund case), and all bits.
	masks := []byte{0x01, 0x04, 0x20, 0x80, 0xff}
	for _, format := range []int{1, 2} {
		t.Run(fmt.Sprintf("format%d", format), func(t *testing.T) {
			defer func(old int) { createFormat = old }(createFormat)
			createFormat = format
			dir := t.TempDir()
			path := filepath.Join(dir, "privacy.ledger")
			l, err := Create(path, testKey(1), &Options{Orders: []float64{1.5, 2, 4, 8, 16, 32, 64}, Now: stepClock()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.DeclareBudget("icu", 100, 1e-5); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				if _, err := l.Charge(ChargeRequest{Dataset: "icu", Consumer: fmt.Sprintf("round-%d", i), Mechanisms: []Mechanism{SubsampledGaussian(1, 1, 3)}}); err != nil {
					t.Fatal(err)
				}
			}
			want, _ := l.Status("icu")
			l.Close()
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			offs := frameOffsets(t, good)
			if len(offs) != 6 {
				t.Fatalf("ledger has %d frames, want 6", len(offs))
			}
			fieldBytes := 4
			if format == 2 {
				fieldBytes = 8 // the length and its checksum
			}
			cases := 0
			for k, off := range offs {
				for b := range fieldBytes {
					ms := masks
					if b >= 4 {
						ms = []byte{0x01, 0xff} // the length's checksum
					}
					for _, m := range ms {
						bad := bytes.Clone(good)
						bad[off+b] ^= m
						if err := os.WriteFile(path, bad, 0o600); err != nil {
							t.Fatal(err)
						}
						what := fmt.Sprintf("entry %d, length byte %d ^ %#02x", k, b, m)
						s, err := Verify(path, nil)
						var ve *VerifyError
						if !errors.As(err, &ve) {
							torn := int64(0)
							if s != nil {
								torn = s.TornBytes
							}
							t.Fatalf("%s: Verify = %v (torn %d bytes), want a VerifyError", what, err, torn)
						}
						if ve.Offset != int64(off) || ve.Seq != uint64(k) {
							t.Fatalf("%s: first bad entry %d at byte %d, want entry %d at byte %d (%s)", what, ve.Seq, ve.Offset, k, off, ve.Reason)
						}
						// The writer is fenced: it refuses, cuts nothing, writes nothing.
						_, err = Open(path, testKey(1), nil)
						if d, ok := diag.As(err); !ok || d[0].Code != diag.LedgerCorrupt {
							t.Fatalf("%s: Open = %v, want SC5014", what, err)
						}
						after, _ := os.ReadFile(path)
						if !bytes.Equal(after, bad) {
							t.Fatalf("%s: the refused open changed the file", what)
						}
						if m, _ := filepath.Glob(path + ".torn-*"); len(m) > 0 {
							t.Fatalf("%s: bytes were cut as a torn tail: %v", what, m)
						}
						// Whatever still verifies holds no less spending
						// than the intact ledger up to the bad entry.
						if s != nil && k >= 2 {
							if st, ok := s.Dataset("icu"); ok && st.Charges != k-2 {
								t.Fatalf("%s: the verified prefix has %d charges, want %d", what, st.Charges, k-2)
							}
						}
						// Framing-only damage is repaired to the very bytes
						// the writer wrote; the damaged file is kept aside.
						// (One mask per byte: each repair fsyncs thrice.)
						if m != 0xff {
							cases++
							continue
						}
						r, err := Repair(path, time.Unix(int64(cases), 0))
						if err != nil {
							t.Fatalf("%s: Repair: %v", what, err)
						}
						if after, _ := os.ReadFile(path); !bytes.Equal(after, good) || len(r.Reframed) != 1 || r.Reframed[0] != int64(off) {
							t.Fatalf("%s: Repair reframed %v and did not restore the written bytes", what, r.Reframed)
						}
						if kept, _ := os.ReadFile(r.SavedAs); !bytes.Equal(kept, bad) {
							t.Fatalf("%s: the damaged file was not kept as %s", what, r.SavedAs)
						}
						os.Remove(r.SavedAs)
						cases++
					}
				}
			}
			// Restored, the ledger charges again from the full spending.
			if err := os.WriteFile(path, good, 0o600); err != nil {
				t.Fatal(err)
			}
			l, err = Open(path, testKey(1), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if _, err := l.Charge(ChargeRequest{Dataset: "icu", Consumer: "round-4", Mechanisms: []Mechanism{SubsampledGaussian(1, 1, 3)}}); err != nil {
				t.Fatal(err)
			}
			st, _ := l.Status("icu")
			if st.Spent <= want.Spent || st.Charges != 5 {
				t.Fatalf("after restore: spent %v with %d charges, want more than %v with 5", st.Spent, st.Charges, want.Spent)
			}
			t.Logf("format %d: %d length-field flips over %d entries, each detected at its entry", format, cases, len(offs))
		})
	}
}

// A torn write is only what a crash can leave: every strict prefix of a
// last frame that stops inside its payload is cut; a prefix that holds the
// whole payload (only CRC bytes missing) is not, since it holds a complete
// signed entry.
func TestLedgerTornTailRule(t *testing.T) {
	for _, format := range []int{1, 2} {
		defer func(old int) { createFormat = old }(createFormat)
		createFormat = format
		l, path := newTestLedger(t, 10)
		if _, err := l.Charge(ChargeRequest{Dataset: "icu", Consumer: "r1", Mechanisms: []Mechanism{SubsampledGaussian(2, 0.01, 10)}}); err != nil {
			t.Fatal(err)
		}
		l.Close()
		good, _ := os.ReadFile(path)
		offs := frameOffsets(t, good)
		last := offs[len(offs)-1]
		n := binary.BigEndian.Uint32(good[last:])
		payloadEnd := last + headerSize(format) + int(n)
		for cut := last + 1; cut < len(good); cut++ {
			// Every cut near the frame's edges, a sample in between.
			if cut > last+16 && cut < payloadEnd-8 && (cut-last)%29 != 0 {
				continue
			}
			s, err := verifyBytes(path, good[:cut], nil)
			if cut < payloadEnd {
				if err != nil || s.TornBytes != int64(cut-last) {
					t.Fatalf("format %d: cut at %d (inside the last payload): %v, want a torn tail", format, cut, err)
				}
				continue
			}
			var ve *VerifyError
			if !errors.As(err, &ve) || ve.Offset != int64(last) {
				t.Fatalf("format %d: cut at %d (payload complete): %v, want corruption at %d", format, cut, err, last)
			}
		}
	}
}

// Repair refuses damage inside an entry (a flipped payload byte): it would
// have to drop or invent a signed entry.
func TestLedgerRepairRefusesDamagedEntry(t *testing.T) {
	l, path := newTestLedger(t, 10)
	if _, err := l.Charge(charge("r1", 2, 0.01, 10)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	good, _ := os.ReadFile(path)
	offs := frameOffsets(t, good)
	bad := bytes.Clone(good)
	bad[offs[1]+40] ^= 0x04
	os.WriteFile(path, bad, 0o600)
	_, err := Repair(path, time.Unix(1, 0))
	wantCode(t, err, diag.LedgerCorrupt)
	if now, _ := os.ReadFile(path); !bytes.Equal(now, bad) {
		t.Fatal("a refused repair changed the file")
	}
}
