package sandboxproc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
)

var sink int

func init() {
	Register("echo", func(_ context.Context, req []byte) ([]byte, error) { return req, nil })
	Register("alloc", func(_ context.Context, req []byte) ([]byte, error) {
		mib, _ := strconv.Atoi(string(req))
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j)
			}
			keep = append(keep, b)
		}
		return []byte(strconv.Itoa(len(keep))), nil
	})
	Register("loop", func(context.Context, []byte) ([]byte, error) {
		for i := 0; ; i++ {
			sink = i // busy, like content that never returns
		}
	})
	Register("diag", func(context.Context, []byte) ([]byte, error) {
		return nil, diag.New(diag.InvalidValue, "subject", "refused")
	})
	Register("panic", func(context.Context, []byte) ([]byte, error) { panic("boom") })
	Register("nice", func(context.Context, []byte) ([]byte, error) { return []byte(threadNiceness()), nil })
}

// threadNiceness lists the niceness of each of this process's threads
// (field 19 of /proc/self/task/*/stat), space-separated, sorted.
func threadNiceness() string {
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []string
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		out = append(out, f[16]) // field 19 of stat; the first two (pid, comm) are cut
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// The test binary is its own child: Main runs the handler when re-executed.
func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

func TestRunEchoes(t *testing.T) {
	out, err := Run(context.Background(), "echo", Limits{MemoryBytes: 256 << 20}, []byte("hello"))
	if err != nil || string(out) != "hello" {
		t.Fatalf("echo: %q %v", out, err)
	}
}

// A child under Limits.Nice runs every thread at that niceness, and
// without it at its parent's.
func TestRunNice(t *testing.T) {
	out, err := Run(context.Background(), "nice", Limits{Nice: 11}, nil)
	if err != nil || len(out) == 0 || strings.ReplaceAll(strings.ReplaceAll(string(out), "11", ""), " ", "") != "" {
		t.Fatalf("the threads of a child at niceness 11: %q %v", out, err)
	}
	out, err = Run(context.Background(), "nice", Limits{}, nil)
	if err != nil || len(out) == 0 || strings.Contains(string(out), "11") {
		t.Fatalf("the threads of a child at its parent's niceness: %q %v", out, err)
	}
}

// RLIMIT_AS holds: a child that allocates past its limit dies of it and
// the parent gets ErrMemory; the same work under a larger limit succeeds.
func TestRunMemoryLimitKills(t *testing.T) {
	_, err := Run(context.Background(), "alloc", Limits{MemoryBytes: 128 << 20}, []byte("1024"))
	if !errors.Is(err, ErrMemory) {
		t.Fatalf("1 GiB under a 128 MiB limit: %v", err)
	}
	out, err := Run(context.Background(), "alloc", Limits{MemoryBytes: 256 << 20}, []byte("32"))
	if err != nil || string(out) != "32" {
		t.Fatalf("32 MiB under 256 MiB: %q %v", out, err)
	}
}

// A child that never returns is killed at its wall-clock limit.
func TestRunWallClockKills(t *testing.T) {
	_, err := Run(context.Background(), "loop", Limits{WallClock: 300 * time.Millisecond}, nil)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("endless loop: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, "loop", Limits{}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestRunCarriesErrors(t *testing.T) {
	_, err := Run(context.Background(), "diag", Limits{}, nil)
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.InvalidValue {
		t.Fatalf("diag: %v", err)
	}
	if _, err := Run(context.Background(), "panic", Limits{}, nil); err == nil {
		t.Fatal("a panicking handler succeeded")
	}
	if _, err := Run(context.Background(), "nope", Limits{}, nil); !errors.Is(err, ErrCrashed) {
		t.Fatalf("unknown handler: %v", err)
	}
}
