package obs

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Summariser is a slog.Handler that writes a record repeated within its
// window — same level, message and attributes — once, counts the repeats,
// and at the end of each window in which there were some writes one
// record: the message with "×N in the last minute" appended and the same
// attributes ("TLS handshake failed ×120 in the last minute"
// from=127.0.0.1 err="remote error: tls: bad certificate"). A silo
// polling with a wrong key, or a lone Raft node failing to reach its peers
// four times a second, then costs a line a minute, and the operator still
// learns how often. A quiet window forgets the record, so its next
// occurrence is written again in full.
type Summariser struct {
	next   slog.Handler
	key    string // the attributes and groups of this derived handler
	shared *summaryState
}

type summaryState struct {
	window time.Duration
	mu     sync.Mutex
	seen   map[string]*repeat
	closed bool
}

// repeat is a record written once and being counted.
type repeat struct {
	h     slog.Handler
	last  slog.Record
	n     int
	timer *time.Timer
}

var _ slog.Handler = (*Summariser)(nil)

// Summarise wraps h; window 0 means a minute.
func Summarise(h slog.Handler, window time.Duration) *Summariser {
	if window <= 0 {
		window = time.Minute
	}
	return &Summariser{next: h, shared: &summaryState{window: window, seen: map[string]*repeat{}}}
}

// Enabled implements slog.Handler.
func (s *Summariser) Enabled(ctx context.Context, l slog.Level) bool { return s.next.Enabled(ctx, l) }

// WithAttrs implements slog.Handler.
func (s *Summariser) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(s.key)
	for _, a := range as {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	return &Summariser{next: s.next.WithAttrs(as), key: b.String(), shared: s.shared}
}

// WithGroup implements slog.Handler.
func (s *Summariser) WithGroup(name string) slog.Handler {
	return &Summariser{next: s.next.WithGroup(name), key: s.key + " [" + name + "]", shared: s.shared}
}

// Handle implements slog.Handler.
func (s *Summariser) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s", s.key, r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	key := b.String()
	st := s.shared
	st.mu.Lock()
	if rp := st.seen[key]; rp != nil {
		rp.n++
		rp.last = r.Clone()
		st.mu.Unlock()
		return nil
	}
	if !st.closed {
		rp := &repeat{h: s.next}
		rp.timer = time.AfterFunc(st.window, func() { st.expire(key, rp) })
		st.seen[key] = rp
	}
	st.mu.Unlock()
	return s.next.Handle(ctx, r)
}

// expire ends rp's window: it writes the summary of its repeats and counts
// on for another window, or forgets a record that did not repeat.
func (st *summaryState) expire(key string, rp *repeat) {
	st.mu.Lock()
	if st.closed || st.seen[key] != rp {
		st.mu.Unlock()
		return
	}
	n, last := rp.n, rp.last
	if n == 0 {
		delete(st.seen, key)
		st.mu.Unlock()
		return
	}
	rp.n = 0
	rp.timer.Reset(st.window)
	st.mu.Unlock()
	rp.h.Handle(context.Background(), summaryRecord(last, n, st.window))
}

func summaryRecord(last slog.Record, n int, window time.Duration) slog.Record {
	span := "minute"
	if window != time.Minute {
		span = window.String()
	}
	r := slog.NewRecord(time.Now(), last.Level, fmt.Sprintf("%s ×%d in the last %s", last.Message, n, span), 0)
	last.Attrs(func(a slog.Attr) bool {
		r.AddAttrs(a)
		return true
	})
	return r
}

// Flush writes the summary of every record repeated so far and forgets
// them all, as if every window had ended now.
func (s *Summariser) Flush() {
	st := s.shared
	st.mu.Lock()
	var out []*repeat
	for k, rp := range st.seen {
		rp.timer.Stop()
		delete(st.seen, k)
		if rp.n > 0 {
			out = append(out, rp)
		}
	}
	st.mu.Unlock()
	for _, rp := range out {
		rp.h.Handle(context.Background(), summaryRecord(rp.last, rp.n, st.window))
	}
}

// Close writes the pending summaries and stops counting: later records
// are written as they come. Call it before the log's writer goes away.
func (s *Summariser) Close() {
	s.Flush()
	s.shared.mu.Lock()
	s.shared.closed = true
	s.shared.mu.Unlock()
}
