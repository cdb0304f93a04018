package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/dp"
)

// scellisInProcess runs the CLI in this process (like a script does).
func scellisInProcess(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// `ledger verify` exits 2 with SC5014 naming the first bad entry when the
// file was edited, and when a recorded head hash is gone (the tail was cut
// off); a ledger that fails verification is fenced: charge refuses it.
func TestLedgerVerifyExitCodes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.ledger")
	if code, _, e := scellisInProcess(t, "ledger", "init", "--ledger", path, "--budget", "icu=5", "--delta", "1e-5"); code != 0 {
		t.Fatal(e)
	}
	var heads []string
	for range 3 {
		code, out, e := scellisInProcess(t, "--json", "ledger", "charge", "--ledger", path, "--dataset", "icu",
			"--consumer", "r", "--sigma", "2", "--q", "0.01", "--steps", "100")
		if code != 0 {
			t.Fatal(e)
		}
		var c chargeLine
		json.Unmarshal([]byte(out), &c)
		heads = append(heads, string(c.Hash))
	}
	good, _ := os.ReadFile(path)
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("ledger created with mode %04o, want 0600", fi.Mode().Perm())
	}

	if code, out, _ := scellisInProcess(t, "ledger", "verify", "--ledger", path, "--head", heads[2]); code != 0 {
		t.Fatalf("intact ledger: exit %d\n%s", code, out)
	}

	// Cut the last entry: consistent in itself, but the anchored head is gone.
	os.Truncate(path, entryOffset(t, path, 4))
	if code, _, _ := scellisInProcess(t, "ledger", "verify", "--ledger", path); code != 0 {
		t.Fatalf("a cleanly truncated ledger should verify in itself, exit %d", code)
	}
	code, _, stderr := scellisInProcess(t, "ledger", "verify", "--ledger", path, "--head", heads[2])
	if code != 2 || !strings.Contains(stderr, "SC5014") || !strings.Contains(stderr, "entry 4") || !strings.Contains(stderr, "entries were removed") {
		t.Fatalf("truncated ledger with --head: exit %d, %s", code, stderr)
	}

	// Flip one byte inside the last entry: corruption, not a torn write
	// (a crash never leaves a full-length frame): verify fails and charge
	// refuses (fenced) without cutting anything.
	bad := bytes.Clone(good)
	bad[len(good)-600] ^= 0x20
	os.WriteFile(path, bad, 0o600)
	code, out, stderr := scellisInProcess(t, "--json", "ledger", "verify", "--ledger", path)
	if code != 2 || !strings.Contains(stderr, "SC5014") || !strings.Contains(stderr, "entry 4 (byte ") || !strings.Contains(out, `"intact": false`) {
		t.Fatalf("edited last entry: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = scellisInProcess(t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "r",
		"--sigma", "2", "--q", "0.01", "--steps", "1")
	if code != 2 || !strings.Contains(stderr, "SC5014") || !strings.Contains(stderr, "fenced") {
		t.Fatalf("charge after a damaged last entry: exit %d, %s", code, stderr)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, bad) {
		t.Fatal("the refused charge changed the ledger")
	}

	// Flip one byte inside entry 3, in the middle of the chain.
	bad = bytes.Clone(good)
	bad[entryOffset(t, path, 3)+100] ^= 0x20
	os.WriteFile(path, bad, 0o600)
	code, out, stderr = scellisInProcess(t, "--json", "ledger", "verify", "--ledger", path)
	if code != 2 || !strings.Contains(stderr, "entry 3") || !strings.Contains(out, `"intact": false`) {
		t.Fatalf("edited ledger: exit %d\n%s%s", code, out, stderr)
	}
	// show and export refuse a broken ledger, and charge refuses with SC5014.
	if code, _, stderr := scellisInProcess(t, "ledger", "show", "--ledger", path); code != 2 || !strings.Contains(stderr, "SC5014") {
		t.Fatalf("show on a broken ledger: exit %d, %s", code, stderr)
	}
	if code, _, stderr := scellisInProcess(t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "r",
		"--sigma", "2", "--q", "0.01", "--steps", "1"); code != 2 || !strings.Contains(stderr, "SC5014") {
		t.Fatalf("charge on a broken ledger: exit %d, %s", code, stderr)
	}
}

// The drill that refunded budget, with the real binary: every byte of the
// first and the last charge's length field flipped alone. Each flip makes `ledger verify` exit
// 2 with SC5014 at that entry's byte offset, and the next `ledger charge`
// refuses; restored, the ledger's spent ε is what it was.
func TestLedgerLengthFlipsRefuseCharges(t *testing.T) {
	t.Parallel() // its own processes and directories
	if testing.Short() {
		t.Skip("runs the binary 24 times")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	path := initLedger(ctx, t, "50")
	code, _, stderr := scellisRun(ctx, t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "round",
		"--sigma", "1", "--q", "1", "--steps", "2", "--repeat", "4")
	if code != 0 {
		t.Fatal(stderr)
	}
	good, _ := os.ReadFile(path)
	spent := func() float64 {
		s, err := dp.Verify(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := s.Dataset("icu")
		return st.Spent
	}
	before := spent()
	for _, k := range []int{2, 5} { // the first and the last charge (dp's test covers every entry)
		off := entryOffset(t, path, k)
		for b := range 4 {
			bad := bytes.Clone(good)
			bad[off+int64(b)] ^= 0xff
			os.WriteFile(path, bad, 0o600)
			code, _, stderr := scellisRun(ctx, t, "ledger", "verify", "--ledger", path)
			want := fmt.Sprintf("entry %d (byte %d)", k, off)
			if code != 2 || !strings.Contains(stderr, "SC5014") || !strings.Contains(stderr, want) {
				t.Fatalf("entry %d length byte %d flipped: verify exit %d, want 2 with SC5014 at %s:\n%s", k, b, code, want, stderr)
			}
			code, _, stderr = scellisRun(ctx, t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "next",
				"--sigma", "1", "--q", "1", "--steps", "1")
			if code != 2 || !strings.Contains(stderr, "SC5014") {
				t.Fatalf("entry %d length byte %d flipped: charge exit %d, want a refusal:\n%s", k, b, code, stderr)
			}
			if now, _ := os.ReadFile(path); !bytes.Equal(now, bad) {
				t.Fatalf("entry %d length byte %d flipped: the refused charge changed the ledger", k, b)
			}
			// Framing-only damage: repair gives back the written bytes.
			if code, _, stderr := scellisRun(ctx, t, "ledger", "repair", "--ledger", path); code != 0 {
				t.Fatalf("entry %d length byte %d flipped: repair exit %d:\n%s", k, b, code, stderr)
			}
			if now, _ := os.ReadFile(path); !bytes.Equal(now, good) {
				t.Fatalf("entry %d length byte %d flipped: repair did not restore the written bytes", k, b)
			}
			if got := spent(); got != before {
				t.Fatalf("spent ε went from %v to %v", before, got)
			}
		}
	}
}

// entryOffset returns the file offset at which entry n's frame starts (see
// the format in dp/ledger_entry.go: 8-byte magic, then frames of a 4-byte
// length, a 4-byte checksum of it, the payload and a 4-byte CRC).
func entryOffset(t *testing.T, path string, n int) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(8)
	for i := 0; i < n; i++ {
		size := int64(data[off])<<24 | int64(data[off+1])<<16 | int64(data[off+2])<<8 | int64(data[off+3])
		off += size + 12
	}
	return off
}
