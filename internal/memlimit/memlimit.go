// Package memlimit gives a process a memory budget it can act on before the
// Go runtime's fatal out-of-memory. Under an address-space limit (ulimit -v,
// RLIMIT_AS) Init sets the runtime's soft memory limit below what is left of
// it, so the garbage collector works hard before an allocation can fail; and
// readers of large inputs (CSV datasets, receipt exports) ask Fits before
// they hold more, so an input too large for the limit is refused with a
// diagnostic that names the file and the limit instead of killing the
// process.
package memlimit

import (
	"bufio"
	"errors"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"

	"github.com/scellis/scellis/diag"
)

// slack is address space left beyond the soft limit for what the runtime
// maps outside the heap it accounts (heap arenas are reserved 64 MiB at a
// time, goroutine stacks, the page allocator's metadata).
const slack = 128 << 20

// Init derives the soft memory limit from RLIMIT_AS when one is set: three
// quarters of what the limit leaves above the address space in use at
// start, less the slack. A lower limit already set (GOMEMLIMIT) is kept.
// It returns the limit in force (math.MaxInt64: none).
func Init() int64 {
	as, ok := addressSpaceLimit()
	if !ok {
		return debug.SetMemoryLimit(-1)
	}
	left := as - addressSpaceInUse() - slack
	soft := max(left/4*3, 16<<20)
	if cur := debug.SetMemoryLimit(-1); cur < soft {
		return cur
	}
	debug.SetMemoryLimit(soft)
	return soft
}

// addressSpaceInUse is the process's virtual size (VmSize), 0 when it
// cannot be read.
func addressSpaceInUse() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// Limit is the soft memory limit in force (math.MaxInt64: none).
func Limit() int64 { return debug.SetMemoryLimit(-1) }

// Limited reports whether a soft memory limit is in force.
func Limited() bool { return Limit() != math.MaxInt64 }

var sampleMu sync.Mutex

// inUse is the memory the soft limit counts (everything the runtime
// mapped, less what it released), without the free heap pages it would
// reuse before asking for more; garbage not yet collected counts.
func inUse() int64 {
	sampleMu.Lock()
	defer sampleMu.Unlock()
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	var v [3]int64
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = int64(s[i].Value.Uint64())
		}
	}
	return v[0] - v[1] - v[2]
}

// Fits reports whether the process may hold need more bytes within its
// soft memory limit, with a tenth of the limit kept for the rest of the
// process. Without a limit everything fits (the file size caps of
// internal/safefile still bound each input).
func Fits(need int64) bool {
	lim := Limit()
	if lim == math.MaxInt64 {
		return true
	}
	if need < 0 {
		return false
	}
	room := lim - lim/10
	if inUse()+need <= room {
		return true
	}
	runtime.GC() // what looked held may be garbage: count only what is live
	return inUse()+need <= room
}

// Room is how many more bytes the process may hold within its soft
// memory limit, with a tenth of the limit kept for the rest of the
// process (as Fits counts); math.MaxUint64 without a limit.
func Room() uint64 {
	lim := Limit()
	if lim == math.MaxInt64 {
		return math.MaxUint64
	}
	return uint64(max(lim-lim/10-inUse(), 0))
}

// TooLarge is the diagnostic of an input that does not fit: file names the
// input, held says how much of it was read, help what to do besides
// giving the process more memory.
func TooLarge(file, held, help string) *diag.Diagnostic {
	return diag.New(diag.InputTooLarge, file, "the input does not fit this process's memory limit (%d MiB, derived from its address-space limit, ulimit -v): %s", Limit()>>20, held).
		WithHelp("%s; or run with a higher address-space limit (ulimit -v) or none", help)
}

// ErrTooLarge is what a Reader returns once the input no longer fits.
var ErrTooLarge = errors.New("the input does not fit the process's memory limit")

// readCheckEvery is how many bytes a Reader passes between two checks, and
// readHeadroom what it requires to fit at each: a reader that buffers a
// whole line (a CSV header of a million columns) grows by what it reads.
const (
	readCheckEvery = 1 << 20
	readHeadroom   = 4 << 20
)

// Reader wraps r so that reading fails with ErrTooLarge once the process
// is near its memory limit, before a reader that buffers what it reads
// makes the runtime fail. Without a limit it returns r.
func Reader(r io.Reader) io.Reader {
	if !Limited() {
		return r
	}
	return &guarded{r: r}
}

type guarded struct {
	r     io.Reader
	since int64
}

func (g *guarded) Read(p []byte) (int, error) {
	if g.since >= readCheckEvery {
		if !Fits(readHeadroom) {
			return 0, ErrTooLarge
		}
		g.since = 0
	}
	n, err := g.r.Read(p)
	g.since += int64(n)
	return n, err
}
