package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scellisInProcess runs the CLI in this process (like a script does).
func scellisInProcess(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// `ledger verify` exits 1 naming the first bad entry when the file was
// edited, and when a recorded head hash is gone (the tail was cut off).
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

	if code, out, _ := scellisInProcess(t, "ledger", "verify", "--ledger", path, "--head", heads[2]); code != 0 {
		t.Fatalf("intact ledger: exit %d\n%s", code, out)
	}

	// Cut the last entry: consistent in itself, but the anchored head is gone.
	os.Truncate(path, entryOffset(t, path, 4))
	if code, _, _ := scellisInProcess(t, "ledger", "verify", "--ledger", path); code != 0 {
		t.Fatalf("a cleanly truncated ledger should verify in itself, exit %d", code)
	}
	code, _, stderr := scellisInProcess(t, "ledger", "verify", "--ledger", path, "--head", heads[2])
	if code != 1 || !strings.Contains(stderr, "entry 4") || !strings.Contains(stderr, "entries were removed") {
		t.Fatalf("truncated ledger with --head: exit %d, %s", code, stderr)
	}

	// Flip one byte inside the last entry: verify fails (an edit and a
	// power loss look alike there); the next charge cuts it and says so.
	bad := bytes.Clone(good)
	bad[len(good)-600] ^= 0x20
	os.WriteFile(path, bad, 0o644)
	code, out, stderr := scellisInProcess(t, "--json", "ledger", "verify", "--ledger", path)
	if code != 1 || !strings.Contains(stderr, "fails verification: entry 4") || !strings.Contains(out, `"intact": false`) {
		t.Fatalf("edited last entry: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = scellisInProcess(t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "r",
		"--sigma", "2", "--q", "0.01", "--steps", "1")
	if code != 0 || !strings.Contains(stderr, "note: cut a torn last write") {
		t.Fatalf("charge after a damaged last entry: exit %d, %s", code, stderr)
	}

	// Flip one byte inside entry 3, in the middle of the chain.
	bad = bytes.Clone(good)
	bad[entryOffset(t, path, 3)+100] ^= 0x20
	os.WriteFile(path, bad, 0o644)
	code, out, stderr = scellisInProcess(t, "--json", "ledger", "verify", "--ledger", path)
	if code != 1 || !strings.Contains(stderr, "fails verification: entry 3") || !strings.Contains(out, `"intact": false`) {
		t.Fatalf("edited ledger: exit %d\n%s%s", code, out, stderr)
	}
	// show and export refuse a broken ledger (exit 1), and charge refuses with SC5014.
	if code, _, stderr := scellisInProcess(t, "ledger", "show", "--ledger", path); code != 1 || !strings.Contains(stderr, "ledger verify") {
		t.Fatalf("show on a broken ledger: exit %d, %s", code, stderr)
	}
	if code, _, stderr := scellisInProcess(t, "ledger", "charge", "--ledger", path, "--dataset", "icu", "--consumer", "r",
		"--sigma", "2", "--q", "0.01", "--steps", "1"); code != 2 || !strings.Contains(stderr, "SC5014") {
		t.Fatalf("charge on a broken ledger: exit %d, %s", code, stderr)
	}
}

// entryOffset returns the file offset at which entry n's frame starts (see
// the format in dp/ledger_entry.go: 8-byte magic, then length-prefixed
// frames with 8 bytes of overhead).
func entryOffset(t *testing.T, path string, n int) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(8)
	for i := 0; i < n; i++ {
		size := int64(data[off])<<24 | int64(data[off+1])<<16 | int64(data[off+2])<<8 | int64(data[off+3])
		off += size + 8
	}
	return off
}
