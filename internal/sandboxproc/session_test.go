package sandboxproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
)

// keep holds what the "hoard" session's requests allocate, so the child's
// mapped memory grows from one request to the next.
var keep [][]byte

func init() {
	// "prefix": the setup is a prefix every answer starts with; a request
	// is one of: "alloc N" (allocate N MiB, then answer), "hoard N" (the
	// same, kept), "loop", "panic", "diag", "stdout" (write garbage to
	// fd 1 first), "pid", or anything else (echoed).
	RegisterSession("prefix", func(_ context.Context, setup []byte) (Handler, error) {
		if string(setup) == "refuse" {
			return nil, diag.New(diag.InvalidValue, "setup", "refused")
		}
		prefix := string(setup)
		return func(_ context.Context, req []byte) ([]byte, error) {
			cmd, arg, _ := strings.Cut(string(req), " ")
			switch cmd {
			case "alloc", "hoard":
				mib, _ := strconv.Atoi(arg)
				var got [][]byte
				for i := 0; i < mib; i++ {
					b := make([]byte, 1<<20)
					for j := range b {
						b[j] = byte(j)
					}
					got = append(got, b)
				}
				if cmd == "hoard" {
					keep = append(keep, got...)
				}
				return []byte(prefix + strconv.Itoa(len(got))), nil
			case "loop":
				for i := 0; ; i++ {
					sink = i
				}
			case "panic":
				panic("boom")
			case "diag":
				return nil, diag.New(diag.InvalidValue, "subject", "refused")
			case "stdout":
				fmt.Fprint(os.Stdout, "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05forge")
			case "pid":
				return []byte(prefix + strconv.Itoa(os.Getpid())), nil
			}
			return append([]byte(prefix), req...), nil
		}, nil
	})
}

func startPrefix(t *testing.T, lim SessionLimits) *Session {
	t.Helper()
	s, err := StartSession(context.Background(), "prefix", lim, []byte("p:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// One child answers many requests in turn, each with what its setup said;
// a stray write to its stdout cannot forge an answer.
func TestSessionServesMany(t *testing.T) {
	s := startPrefix(t, SessionLimits{Limits: Limits{MemoryBytes: 256 << 20}})
	var pid string
	for i := 0; i < 50; i++ {
		req := "r" + strconv.Itoa(i)
		if i == 7 {
			req = "stdout"
		}
		out, err := s.Do(context.Background(), []byte(req))
		if err != nil || string(out) != "p:"+req {
			t.Fatalf("request %d: %q %v", i, out, err)
		}
		if i%10 == 0 {
			out, err := s.Do(context.Background(), []byte("pid"))
			if err != nil {
				t.Fatal(err)
			}
			if pid != "" && string(out) != pid {
				t.Fatalf("request %d ran in another child: %s, then %s", i, pid, out)
			}
			pid = string(out)
		}
	}
	if !s.Reusable() {
		t.Fatal("a healthy session is not reusable")
	}
}

// A request that exhausts the child's address space fails with ErrMemory
// and retires the child; the next request, in a new child of the same
// pool, gets its own right answer.
func TestSessionMemoryExhaustedThenNext(t *testing.T) {
	var p Pool
	defer p.Close()
	// 256 MiB: room for a binary built with -race (its shadow memory)
	// to allocate 16 MiB, none to allocate 1 GiB.
	lim := SessionLimits{Limits: Limits{MemoryBytes: 256 << 20}}
	setup := func() ([]byte, error) { return []byte("p:"), nil }
	if out, err := p.Do(context.Background(), "job", "prefix", lim, setup, []byte("pid")); err != nil {
		t.Fatalf("first: %q %v", out, err)
	}
	if _, err := p.Do(context.Background(), "job", "prefix", lim, setup, []byte("alloc 1024")); !errors.Is(err, ErrMemory) {
		t.Fatalf("1 GiB under 256 MiB: %v", err)
	}
	if p.Idle() != 0 {
		t.Fatalf("the exhausted child was kept: %d idle", p.Idle())
	}
	out, err := p.Do(context.Background(), "job", "prefix", lim, setup, []byte("alloc 16"))
	if err != nil || string(out) != "p:16" {
		t.Fatalf("the next request: %q %v", out, err)
	}
}

// A request past the wall clock kills the child (ErrTimeout); failed and
// panicking requests retire it; a failed setup is an error.
func TestSessionFailuresRetire(t *testing.T) {
	s := startPrefix(t, SessionLimits{Limits: Limits{WallClock: 300 * time.Millisecond}})
	if _, err := s.Do(context.Background(), []byte("loop")); !errors.Is(err, ErrTimeout) {
		t.Fatalf("endless loop: %v", err)
	}
	if s.Reusable() {
		t.Fatal("a killed session is reusable")
	}
	for _, req := range []string{"diag", "panic"} {
		s := startPrefix(t, SessionLimits{})
		_, err := s.Do(context.Background(), []byte(req))
		if err == nil || s.Reusable() {
			t.Fatalf("%s: %v, reusable %v", req, err, s.Reusable())
		}
		if req == "diag" {
			if ds, ok := diag.As(err); !ok || ds[0].Code != diag.InvalidValue {
				t.Fatalf("diag: %v", err)
			}
		}
	}
	if _, err := StartSession(context.Background(), "prefix", SessionLimits{}, []byte("refuse")); err == nil {
		t.Fatal("a refused setup started a session")
	} else if ds, ok := diag.As(err); !ok || ds[0].Code != diag.InvalidValue {
		t.Fatalf("refused setup: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s = startPrefix(t, SessionLimits{})
	go func() { cancel() }()
	if _, err := s.Do(ctx, []byte("loop")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// A child is retired after MaxRequests, and once the memory it has
// mapped passes RecycleBytes.
func TestSessionRecycles(t *testing.T) {
	s := startPrefix(t, SessionLimits{MaxRequests: 3})
	for i := 0; i < 3; i++ {
		if !s.Reusable() {
			t.Fatalf("retired after %d requests", i)
		}
		if _, err := s.Do(context.Background(), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if s.Reusable() {
		t.Fatal("reusable after MaxRequests")
	}
	s = startPrefix(t, SessionLimits{Limits: Limits{MemoryBytes: 512 << 20}, RecycleBytes: 64 << 20})
	if _, err := s.Do(context.Background(), []byte("x")); err != nil || !s.Reusable() {
		t.Fatalf("a small request retired the child: %v", err)
	}
	if _, err := s.Do(context.Background(), []byte("hoard 96")); err != nil {
		t.Fatal(err)
	}
	if s.Reusable() {
		t.Fatal("a child holding 96 MiB is reusable under RecycleBytes 64 MiB")
	}
}

// Idle sessions are reused by key, bounded in number and closed by Close.
func TestPoolKeys(t *testing.T) {
	p := Pool{MaxIdle: 2}
	defer p.Close()
	setup := func() ([]byte, error) { return []byte("p:"), nil }
	pidOf := func(key string) string {
		out, err := p.Do(context.Background(), key, "prefix", SessionLimits{}, setup, []byte("pid"))
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	a := pidOf("a")
	if pidOf("a") != a {
		t.Fatal("key a's idle session was not reused")
	}
	b := pidOf("b")
	if b == a {
		t.Fatal("key b ran in key a's child")
	}
	pidOf("c") // evicts a, the oldest
	if p.Idle() != 2 {
		t.Fatalf("%d idle, want 2", p.Idle())
	}
	if pidOf("a") == a {
		t.Fatal("an evicted session was reused")
	}
	p.Close()
	if p.Idle() != 0 {
		t.Fatalf("%d idle after Close", p.Idle())
	}
}

// BenchmarkSession: requests through a reused child against a child
// started per request (Run), in one run.
func BenchmarkSession(b *testing.B) {
	b.Run("child-per-request", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := Run(context.Background(), "echo", Limits{MemoryBytes: 256 << 20}, []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("session", func(b *testing.B) {
		var p Pool
		defer p.Close()
		setup := func() ([]byte, error) { return []byte("p:"), nil }
		for i := 0; i < b.N; i++ {
			if _, err := p.Do(context.Background(), "k", "prefix", SessionLimits{Limits: Limits{MemoryBytes: 256 << 20}}, setup, []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
