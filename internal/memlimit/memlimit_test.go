package memlimit

import (
	"errors"
	"io"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// Fits and Reader answer against the soft limit in force: everything fits
// without one; with one, what would pass the limit does not, and a reader
// fails with ErrTooLarge instead of growing a buffer past it.
func TestFitsAndReaderFollowTheLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	debug.SetMemoryLimit(math.MaxInt64)
	if !Fits(1<<40) || Limited() {
		t.Fatal("without a limit a terabyte should fit")
	}
	if r := strings.NewReader("x"); Reader(r) != io.Reader(r) {
		t.Fatal("without a limit Reader should return its reader")
	}
	debug.SetMemoryLimit(inUse() + 256<<20)
	if !Fits(1<<20) || Fits(1<<30) || Fits(-1) {
		t.Fatalf("limit %d MiB, in use %d MiB: a MiB should fit and a GiB not", Limit()>>20, inUse()>>20)
	}
	debug.SetMemoryLimit(inUse() / 2)
	_, err := io.Copy(io.Discard, Reader(strings.NewReader(strings.Repeat("x", 3<<20))))
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a reader past the limit: %v, want ErrTooLarge", err)
	}
	if d := TooLarge("f.csv", "3 rows", "split it"); d.Code != diag.InputTooLarge || !strings.Contains(d.Message, "memory limit") {
		t.Fatalf("diagnostic %+v", d)
	}
}
