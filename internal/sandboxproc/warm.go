package sandboxproc

import (
	"context"
	"sync"
)

// anyName is the handler name of a spare child: it reads the real name
// from the first line of its request.
const anyName = "-"

// Warm runs handlers like Run, but keeps one child started ahead under
// its limits, so a request does not wait for a process to start (exec,
// the Go runtime, package initialisation: tens of milliseconds of a
// large binary, more on a busy machine). Isolation is Run's: the spare is
// a separate process with the same limits, set on itself before it reads
// anything; it serves exactly one request and exits, and a new spare is
// started for the next. No two requests ever share a process. The
// wall-clock limit counts from when the spare is handed its request.
//
// A spare that dies while it waits (its parent gone: its stdin closes) is
// never handed a request. Close kills the spare.
type Warm struct {
	lim Limits

	mu     sync.Mutex
	spare  *proc
	coming chan struct{} // non-nil while a spare is being started; closed when it is
	closed bool
	wg     sync.WaitGroup // spares being started
}

// NewWarm returns a Warm for children under lim. Its first Run starts a
// child then and there; every Run leaves a spare for the next.
func NewWarm(lim Limits) *Warm { return &Warm{lim: lim} }

// Run runs the handler name in a child (the spare if one is ready or on
// its way), sends it req and returns its response, as Run does. The next
// spare is started once this request is answered, so it never competes
// with this one for the CPU.
func (w *Warm) Run(ctx context.Context, name string, req []byte) ([]byte, error) {
	c := w.take(ctx)
	if c == nil {
		var err error
		if c, err = start(anyName, w.lim); err != nil {
			return nil, err
		}
	}
	defer w.refill()
	return c.serve(ctx, name, w.lim, req)
}

// take returns the spare, waiting for one being started, or nil when
// there is none alive.
func (w *Warm) take(ctx context.Context) *proc {
	w.mu.Lock()
	if w.spare == nil && w.coming != nil {
		coming := w.coming
		w.mu.Unlock()
		select {
		case <-coming:
		case <-ctx.Done():
			return nil
		}
		w.mu.Lock()
	}
	defer w.mu.Unlock()
	c := w.spare
	w.spare = nil
	if c != nil && c.exited() {
		return nil
	}
	return c
}

// refill starts a spare in the background unless one is there or on its
// way (or Close was called).
func (w *Warm) refill() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.spare != nil || w.coming != nil {
		return
	}
	coming := make(chan struct{})
	w.coming = coming
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(coming)
		c, err := start(anyName, w.lim)
		w.mu.Lock()
		w.coming = nil
		if err != nil {
			w.mu.Unlock()
			return // the next Run starts its own child and reports why
		}
		if w.closed || w.spare != nil {
			w.mu.Unlock()
			c.kill()
			return
		}
		w.spare = c
		w.mu.Unlock()
	}()
}

// Close kills the spare; Runs in progress are not affected. Run still
// works after Close, without spares.
func (w *Warm) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
	w.mu.Lock()
	c := w.spare
	w.spare = nil
	w.mu.Unlock()
	if c != nil {
		c.kill()
	}
}
