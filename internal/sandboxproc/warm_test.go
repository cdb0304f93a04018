package sandboxproc

import (
	"context"
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func init() {
	Register("pid", func(context.Context, []byte) ([]byte, error) {
		return []byte(strconv.Itoa(os.Getpid())), nil
	})
}

// A Warm serves every request from a fresh process (never two in one),
// under the same limits as Run, and Close kills its spare.
func TestWarmOneProcessPerRequest(t *testing.T) {
	w := NewWarm(Limits{MemoryBytes: 128 << 20, WallClock: 10 * time.Second})
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		out, err := w.Run(context.Background(), "pid", nil)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(out)] {
			t.Fatalf("request %d was served by process %s again", i, out)
		}
		seen[string(out)] = true
	}
	if out, err := w.Run(context.Background(), "echo", []byte("hello")); err != nil || string(out) != "hello" {
		t.Fatalf("echo: %q %v", out, err)
	}
	// The spare's limits are Run's: 1 GiB under 128 MiB dies of it.
	if _, err := w.Run(context.Background(), "alloc", []byte("1024")); !errors.Is(err, ErrMemory) {
		t.Fatalf("1 GiB under a 128 MiB limit: %v", err)
	}
	if _, err := w.Run(context.Background(), "nope", nil); !errors.Is(err, ErrCrashed) {
		t.Fatalf("unknown handler: %v", err)
	}
	// The wall clock still kills, from the moment the spare is handed the request.
	short := NewWarm(Limits{WallClock: 300 * time.Millisecond})
	defer short.Close()
	if _, err := short.Run(context.Background(), "loop", nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("endless loop: %v", err)
	}

	// Close kills the spare the last Run left (waiting for it to start).
	deadline := time.Now().Add(time.Minute)
	var spare *proc
	for spare == nil {
		w.mu.Lock()
		spare = w.spare
		w.mu.Unlock()
		if spare == nil {
			if time.Now().After(deadline) {
				t.Fatal("no spare was started")
			}
			w.wg.Wait()
		}
	}
	w.Close()
	if !spare.exited() {
		t.Fatal("the spare outlived Close")
	}
	if err := syscall.Kill(spare.cmd.Process.Pid, 0); err == nil {
		t.Fatalf("spare %d still exists after Close", spare.cmd.Process.Pid)
	}
	// Run still works after Close, without spares.
	if out, err := w.Run(context.Background(), "echo", []byte("x")); err != nil || string(out) != "x" {
		t.Fatalf("after Close: %q %v", out, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.spare != nil {
		t.Fatal("a spare was started after Close")
	}
}
