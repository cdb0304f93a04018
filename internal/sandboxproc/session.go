package sandboxproc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A session is one child that serves a run of requests of the same kind
// (the shards of one job, with one bundle and one set of limits), so the
// start of a process — exec, the Go runtime, initialisation, compiling the
// job — is paid once per run instead of once per request. The child is
// the same binary under the same limits as Run's (RLIMIT_AS set on itself
// before it reads anything, its own process group, the wall clock counted
// per request), and the parent retires it
//
//   - after MaxRequests requests,
//   - after any request that failed (an error, a panic, a stop by the
//     in-sandbox guards), so a request never runs after a failed one,
//   - when the address space the Go runtime has mapped passes RecycleBytes
//     (what one request grew is then not left to the next),
//   - and at once when it dies, exceeds a wall clock or is cancelled.
//
// What a request can see of an earlier one in the same child is what the
// handler keeps between them (for shards: the compiled job, immutable) and
// the process itself: its heap's size and fragmentation, the garbage
// collector's pace, and timing. Handlers keep no mutable state between
// requests; package script gives every call a fresh interpreter thread and
// fresh module globals.
//
// The wire: the parent writes frames (4-byte big-endian length, bytes) to
// the child's stdin, the setup first; the child answers each with a
// status byte, the runtime's mapped bytes (8 bytes), a length and the
// payload, on a copy of its stdout (file descriptor 1 itself is pointed at
// stderr, so a stray write by anything in the child cannot forge a frame).

// SessionHandler prepares a session's child: it gets the setup bytes once
// and returns the Handler that serves each request. What it keeps between
// requests must be immutable.
type SessionHandler func(ctx context.Context, setup []byte) (Handler, error)

var sessionHandlers = map[string]SessionHandler{}

// RegisterSession makes h startable as a session under name. Call it from
// an init function.
func RegisterSession(name string, h SessionHandler) {
	register(sessionHandlers, "session handler", name, h)
}

// sessionArg is argv[3] of a child started as a session.
const sessionArg = "session"

// maxFrame bounds a frame either side reads (the parent's MaxOutput is
// checked as well).
const maxFrame = 1 << 30

// SessionLimits bound a session: every child's Limits, plus when it is
// retired.
type SessionLimits struct {
	Limits
	// MaxRequests is how many requests one child serves (0: 1000).
	MaxRequests int
	// RecycleBytes retires a child once the runtime has mapped more than
	// this (0: half of MemoryBytes; no MemoryBytes: never).
	RecycleBytes uint64
}

// DefaultMaxRequests is SessionLimits.MaxRequests when unset.
const DefaultMaxRequests = 1000

// Session is one started child serving requests in turn. It is not safe
// for concurrent use: one request at a time (a Pool hands each to one
// caller).
type Session struct {
	lim    SessionLimits
	proc   *proc
	in     io.WriteCloser
	out    *bufio.Reader
	outF   *os.File
	served int
	mapped uint64
	broken bool // failed, killed, or dead: never reused
}

// StartSession starts a child running the session handler name, sends it
// setup and waits for it to be ready (under lim's wall clock, counted
// from now). A setup that fails is an error, as Run's, and no session.
func StartSession(ctx context.Context, name string, lim SessionLimits, setup []byte) (*Session, error) {
	if lim.MaxRequests <= 0 {
		lim.MaxRequests = DefaultMaxRequests
	}
	if lim.RecycleBytes == 0 {
		lim.RecycleBytes = lim.MemoryBytes / 2
	}
	// Our own pipe for its answers, not StdoutPipe: cmd.Wait (run as soon
	// as the child starts, to learn when it dies) would close StdoutPipe's
	// end under a read in progress.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandboxproc: starting the child: %w", err)
	}
	// The parent-death signal ends a child whose worker died, even in
	// the middle of a request (its stdin closing ends an idle one).
	c, err := launch([]string{name, sessionArg}, lim.Limits, w, &capped{max: 64 << 10, keepTail: true}, syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL})
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	s := &Session{lim: lim, proc: c, in: c.stdin, out: bufio.NewReaderSize(r, 64<<10), outF: r}
	if _, err := s.do(ctx, setup); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Do sends req to the child and returns its answer. Any error retires the
// session (Reusable reports false): the error is the handler's, or
// ErrMemory, ErrTimeout, ErrCrashed, or ctx's.
func (s *Session) Do(ctx context.Context, req []byte) ([]byte, error) {
	if s.broken {
		return nil, fmt.Errorf("%w: the session was retired", ErrCrashed)
	}
	out, err := s.do(ctx, req)
	s.served++
	return out, err
}

// Reusable reports whether the session may serve another request.
func (s *Session) Reusable() bool {
	return !s.broken && !s.proc.exited() && s.served < s.lim.MaxRequests &&
		(s.lim.RecycleBytes == 0 || s.mapped <= s.lim.RecycleBytes)
}

// Close ends the child: its process group is killed (unless it has
// exited already) and its pipes are closed.
func (s *Session) Close() {
	s.broken = true
	s.proc.kill()
	s.in.Close()
	s.outF.Close()
}

type frame struct {
	status  byte
	mapped  uint64
	payload []byte
	err     error
}

func (s *Session) do(ctx context.Context, req []byte) ([]byte, error) {
	if s.lim.WallClock > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.lim.WallClock)
		defer cancel()
	}
	maxOut := s.lim.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	got := make(chan frame, 1)
	go func() {
		// A child that died makes the write fail; the read then fails
		// too, and the child's exit is what Do reports.
		if err := writeFrame(s.in, req); err != nil {
			got <- frame{err: err}
			return
		}
		got <- s.readFrame(maxOut)
	}()
	var f frame
	select {
	case f = <-got:
	case <-ctx.Done():
		s.broken = true
		s.proc.kill()
		s.outF.Close() // ends the read if the child's group left the pipe open
		<-got
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ErrTimeout
		}
		return nil, ctx.Err()
	}
	if f.err != nil {
		s.broken = true
		if errors.Is(f.err, errFrameTooLarge) {
			s.proc.kill()
			return nil, fmt.Errorf("%w: its response exceeds %d bytes", ErrCrashed, maxOut)
		}
		// The child is dead or dying: its exit says why.
		select {
		case <-s.proc.done:
		case <-time.After(5 * time.Second):
			s.proc.kill()
		}
		stderr := s.proc.stderr.String()
		if isOOM(stderr) {
			return nil, ErrMemory
		}
		return nil, fmt.Errorf("%w: %v%s", ErrCrashed, s.proc.err, tail(stderr))
	}
	s.mapped = f.mapped
	switch f.status {
	case statusOK:
		return f.payload, nil
	case statusErr:
		s.broken = true // a failed request retires the child
		return nil, decodeFailure(f.payload)
	}
	s.broken = true
	return nil, fmt.Errorf("%w: malformed response", ErrCrashed)
}

var errFrameTooLarge = errors.New("frame too large")

func (s *Session) readFrame(maxOut int) frame {
	var h [13]byte
	if _, err := io.ReadFull(s.out, h[:]); err != nil {
		return frame{err: err}
	}
	n := binary.BigEndian.Uint32(h[9:])
	if int64(n) > int64(maxOut) {
		return frame{err: errFrameTooLarge}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(s.out, p); err != nil {
		return frame{err: err}
	}
	return frame{status: h[0], mapped: binary.BigEndian.Uint64(h[1:9]), payload: p}
}

func writeFrame(w io.Writer, b []byte) error {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(b)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// childSession is the child's side of a session: setup, then one answer
// per request until stdin closes.
func childSession(name string, in io.Reader) int {
	mu.RLock()
	sh := sessionHandlers[name]
	mu.RUnlock()
	if sh == nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: no session handler %q\n", name)
		return 3
	}
	// Frames go out on a copy of stdout; descriptor 1 becomes stderr.
	fd, err := unix.Dup(1)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: %v\n", err)
		return 3
	}
	if err := unix.Dup2(2, 1); err != nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: %v\n", err)
		return 3
	}
	out := bufio.NewWriterSize(os.NewFile(uintptr(fd), "sandbox-frames"), 64<<10)
	br := bufio.NewReaderSize(in, 64<<10)
	answer := func(resp []byte, err error) bool {
		status := statusOK
		if err != nil {
			status, resp = statusErr, encodeFailure(err)
		}
		var h [13]byte
		h[0] = status
		binary.BigEndian.PutUint64(h[1:9], mappedBytes())
		binary.BigEndian.PutUint32(h[9:], uint32(len(resp)))
		out.Write(h[:])
		out.Write(resp)
		return out.Flush() == nil
	}
	setup, err := readChildFrame(br)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: reading the setup: %v\n", err)
		return 3
	}
	var h Handler
	_, err = run(func(ctx context.Context, b []byte) ([]byte, error) {
		var err error
		h, err = sh(ctx, b)
		return nil, err
	}, setup)
	if !answer(nil, err) || err != nil {
		return 0
	}
	for {
		req, err := readChildFrame(br)
		if err == io.EOF {
			return 0
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandboxproc: reading a request: %v\n", err)
			return 3
		}
		if !answer(run(h, req)) {
			return 3
		}
	}
}

func readChildFrame(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > maxFrame {
		return nil, errFrameTooLarge
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

// mappedBytes is the memory the Go runtime has mapped from the OS (heap,
// stacks, its own structures), less what it has returned: the address
// space the process holds beyond its start.
func mappedBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// Pool keeps idle sessions by key (a job: its bundle and limits), so a
// run of requests of one key reuses children; at most one request runs
// in a session at a time, and as many sessions of a key start as
// requests of it run at once. Idle sessions are closed after IdleTimeout
// and beyond MaxIdle (the oldest first). Close ends them all.
type Pool struct {
	// IdleTimeout closes a session idle this long (0: 30 s).
	IdleTimeout time.Duration
	// MaxIdle bounds the idle sessions kept across keys (0: 8).
	MaxIdle int

	mu     sync.Mutex
	idle   []idleSession // oldest first
	closed bool
	timer  *time.Timer
}

type idleSession struct {
	key   string
	s     *Session
	since time.Time
}

// Do runs req in an idle session of key, or in a new one started with
// the handler name, lim and the bytes setup returns. The session goes
// back to the pool when it is still Reusable.
func (p *Pool) Do(ctx context.Context, key, name string, lim SessionLimits, setup func() ([]byte, error), req []byte) ([]byte, error) {
	s := p.take(key)
	if s == nil {
		b, err := setup()
		if err != nil {
			return nil, err
		}
		if s, err = StartSession(ctx, name, lim, b); err != nil {
			return nil, err
		}
	}
	out, err := s.Do(ctx, req)
	p.put(key, s)
	return out, err
}

func (p *Pool) take(key string) *Session {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.idle) - 1; i >= 0; i-- {
		if p.idle[i].key == key {
			s := p.idle[i].s
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			if s.Reusable() {
				return s
			}
			go s.Close()
		}
	}
	return nil
}

func (p *Pool) put(key string, s *Session) {
	if !s.Reusable() {
		s.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		s.Close()
		return
	}
	p.idle = append(p.idle, idleSession{key: key, s: s, since: time.Now()})
	var evict []*Session
	for len(p.idle) > p.maxIdle() {
		evict = append(evict, p.idle[0].s)
		p.idle = p.idle[1:]
	}
	if p.timer == nil {
		p.timer = time.AfterFunc(p.idleTimeout(), p.reap)
	}
	p.mu.Unlock()
	for _, s := range evict {
		s.Close()
	}
}

func (p *Pool) maxIdle() int {
	if p.MaxIdle > 0 {
		return p.MaxIdle
	}
	return 8
}

func (p *Pool) idleTimeout() time.Duration {
	if p.IdleTimeout > 0 {
		return p.IdleTimeout
	}
	return 30 * time.Second
}

// reap closes the sessions idle past IdleTimeout and re-arms itself while
// any are left.
func (p *Pool) reap() {
	p.mu.Lock()
	cut := time.Now().Add(-p.idleTimeout())
	var old []*Session
	keep := p.idle[:0]
	for _, e := range p.idle {
		if e.since.Before(cut) {
			old = append(old, e.s)
		} else {
			keep = append(keep, e)
		}
	}
	p.idle = keep
	p.timer = nil
	if len(p.idle) > 0 && !p.closed {
		p.timer = time.AfterFunc(time.Until(p.idle[0].since.Add(p.idleTimeout())), p.reap)
	}
	p.mu.Unlock()
	for _, s := range old {
		s.Close()
	}
}

// Close ends every idle session; sessions in use end when their request
// does. Do still works after Close, without keeping sessions.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
	for _, e := range idle {
		e.s.Close()
	}
}

// Idle is how many sessions are kept idle now (for tests and metrics).
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}
