package sandboxproc

import (
	"context"
	"testing"
	"time"
)

// BenchmarkWarm: the latency of one request to a child started for it
// (Run) and to a spare started ahead (Warm), with a pause between
// requests (as between a job's plan and its reduction) that is not
// timed. Compare the two ns/op in one run.
//
//	go test -run '^$' -bench Warm -benchtime 20x ./internal/sandboxproc/
func BenchmarkWarm(b *testing.B) {
	lim := Limits{MemoryBytes: 256 << 20, WallClock: time.Minute}
	pause := func(b *testing.B) {
		b.StopTimer()
		time.Sleep(100 * time.Millisecond) // idle between requests, not measured
		b.StartTimer()
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			if _, err := Run(context.Background(), "echo", lim, []byte("x")); err != nil {
				b.Fatal(err)
			}
			pause(b)
		}
	})
	b.Run("warm", func(b *testing.B) {
		w := NewWarm(lim)
		defer w.Close()
		for b.Loop() {
			if _, err := w.Run(context.Background(), "echo", []byte("x")); err != nil {
				b.Fatal(err)
			}
			pause(b)
		}
	})
}
