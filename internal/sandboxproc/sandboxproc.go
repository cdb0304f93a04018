// Package sandboxproc runs untrusted work in a child process of the same
// binary, under limits the operating system enforces: an address-space
// limit (RLIMIT_AS, set by the child on itself before it reads its
// request), a wall-clock limit (the parent kills the child's process
// group), and bounded output. The in-sandbox guards of package script stay
// in force inside the child; this package holds where they cannot, such as
// one built-in operation that allocates before any check, or a native call
// that never yields.
//
// A binary that uses it calls Main first thing in main (and in TestMain of
// a test binary that runs handlers): when the process was started as a
// child (argv[1] is the hidden subcommand), Main runs the named handler
// and exits. Handlers register in init functions, so parent and child,
// being the same binary, agree on them. A session (session.go) is a child
// that serves a run of requests of one kind, under the same limits.
//
// The invariant: a handler's failure, however it happens (an error, a
// panic, an exhausted limit, a killed process), reaches the parent as an
// error, never as a crash of the parent.
package sandboxproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/scellis/scellis/diag"
)

// Subcommand is the hidden argv[1] that makes a process a sandbox child.
const Subcommand = "__sandbox"

const (
	envMemory = "SCELLIS_SANDBOX_MEMORY"
	envNice   = "SCELLIS_SANDBOX_NICE"
)

// DefaultMaxOutput bounds a child's response.
const DefaultMaxOutput = 64 << 20

// Errors a Run returns when the OS or the parent stopped the child.
var (
	// ErrMemory: the child exceeded its address-space limit.
	ErrMemory = errors.New("sandboxproc: the child exceeded its memory limit")
	// ErrTimeout: the child ran past its wall-clock limit and was killed.
	ErrTimeout = errors.New("sandboxproc: the child exceeded its wall-clock limit")
	// ErrCrashed: the child died some other way, or answered garbage.
	ErrCrashed = errors.New("sandboxproc: the child died")
)

// Handler is work run in the child: it gets the request bytes and returns
// response bytes. An error that is a diag list reaches the parent as the
// same diagnostics; any other error as its message.
type Handler func(ctx context.Context, req []byte) ([]byte, error)

var (
	mu       sync.RWMutex
	handlers = map[string]Handler{}
	warmups  []func()
)

// Warmup registers f to run in every child once its limits are set and
// before it reads its request: the engine's own preparation (such as
// loading its built-in content), never a request's work. In a spare
// (Warm) it runs while the spare waits, so requests do not wait for it.
// Call it from an init function.
func Warmup(f func()) {
	mu.Lock()
	defer mu.Unlock()
	warmups = append(warmups, f)
}

// Register makes h runnable under name. Call it from an init function.
func Register(name string, h Handler) { register(handlers, "handler", name, h) }

// register adds h to m under name, once.
func register[H any](m map[string]H, kind, name string, h H) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := m[name]; dup {
		panic("sandboxproc: " + kind + " registered twice: " + name)
	}
	m[name] = h
}

// Limits bound one child.
type Limits struct {
	// MemoryBytes is the address space the child may add to what the Go
	// runtime had mapped when it started (the runtime reserves about a
	// gigabyte of address space up front, so a plain RLIMIT_AS of a few
	// hundred MiB would stop it before it runs). 0: no limit.
	MemoryBytes uint64
	// WallClock is the child's wall-clock budget; past it the child's
	// process group is killed. 0: only ctx bounds it.
	WallClock time.Duration
	// MaxOutput bounds the response (0: DefaultMaxOutput).
	MaxOutput int
	// Nice, when positive, is the child's niceness (1 to 19): it runs
	// at a lower CPU priority than its parent, taking only the cores
	// nothing else wants. A silo runs generic pool shards so, beside its
	// training rounds (docs/silo.md). 0: the parent's.
	Nice int
}

// Executable returns the binary to re-execute (tests may replace it).
var Executable = os.Executable

// Run runs the handler name in a child process under lim, sends it req and
// returns its response. A cancelled ctx kills the child.
func Run(ctx context.Context, name string, lim Limits, req []byte) ([]byte, error) {
	c, err := start(name, lim)
	if err != nil {
		return nil, err
	}
	return c.serve(ctx, name, lim, req)
}

// proc is one started child: under Run and Warm it serves one request,
// then exits; under a Session (session.go), a run of requests.
type proc struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr *capped
	done           chan struct{} // closed when the child has exited
	err            error         // cmd.Wait's answer, once done
}

// start starts a child under lim. name is the handler, or anyName for a
// child that reads the handler's name from its request (a spare, Warm).
func start(name string, lim Limits) (*proc, error) {
	maxOut := lim.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	stdout := &capped{max: maxOut + 1}
	c, err := launch([]string{name}, lim, stdout, &capped{max: 64 << 10}, syscall.SysProcAttr{})
	if err != nil {
		return nil, err
	}
	c.stdout = stdout
	return c, nil
}

// launch starts this binary as a child with args after Subcommand, its
// memory limit in the environment, stdout and stderr as given, in its own
// process group (so a kill reaches anything it started), and a goroutine
// that waits for it.
func launch(args []string, lim Limits, stdout io.Writer, stderr *capped, attr syscall.SysProcAttr) (*proc, error) {
	exe, err := Executable()
	if err != nil {
		return nil, fmt.Errorf("sandboxproc: finding this binary: %w", err)
	}
	cmd := exec.Command(exe, append([]string{Subcommand}, args...)...)
	cmd.Env = append(os.Environ(), envMemory+"="+strconv.FormatUint(lim.MemoryBytes, 10), envNice+"="+strconv.Itoa(lim.Nice))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("sandboxproc: starting the child: %w", err)
	}
	c := &proc{cmd: cmd, stdin: stdin, stderr: stderr, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	attr.Setpgid = true
	cmd.SysProcAttr = &attr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandboxproc: starting the child: %w", err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// kill ends the child's process group and waits for the child.
// A child that has exited is not signalled: once it is reaped its process
// group ID may belong to another process group.
func (c *proc) kill() error {
	if !c.exited() {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-c.done
	return c.err
}

// exited reports whether the child has already ended (a spare that died
// waiting must not be handed a request).
func (c *proc) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// serve sends the child its request (preceded by the handler's name when
// the child was started without one), waits for its answer under lim's
// wall clock, counted from now, and decodes it.
func (c *proc) serve(ctx context.Context, name string, lim Limits, req []byte) ([]byte, error) {
	if lim.WallClock > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lim.WallClock)
		defer cancel()
	}
	maxOut := c.stdout.max - 1
	go func() {
		// A child that dies or is killed before reading everything makes
		// these writes fail; its exit is what Run reports.
		if c.cmd.Args[2] == anyName {
			io.WriteString(c.stdin, name+"\n")
		}
		c.stdin.Write(req)
		c.stdin.Close()
	}()
	var waitErr error
	killed := false
	select {
	case <-c.done:
		waitErr = c.err
	case <-ctx.Done():
		killed = true
		waitErr = c.kill()
	}
	if killed {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ErrTimeout
		}
		return nil, ctx.Err()
	}
	stderr := c.stderr.String()
	if waitErr != nil {
		if isOOM(stderr) {
			return nil, ErrMemory
		}
		return nil, fmt.Errorf("%w: %v%s", ErrCrashed, waitErr, tail(stderr))
	}
	out := c.stdout.Bytes()
	if len(out) > maxOut {
		return nil, fmt.Errorf("%w: its response exceeds %d bytes", ErrCrashed, maxOut)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty response%s", ErrCrashed, tail(stderr))
	}
	switch out[0] {
	case statusOK:
		return out[1:], nil
	case statusErr:
		return nil, decodeFailure(out[1:])
	}
	return nil, fmt.Errorf("%w: malformed response", ErrCrashed)
}

const (
	statusOK  byte = 0
	statusErr byte = 1
)

type wireError struct {
	Message     string    `json:"message,omitempty"`
	Diagnostics diag.List `json:"diagnostics,omitempty"`
}

// encodeFailure is how a child sends a handler's error: its diagnostics,
// or its message.
func encodeFailure(err error) []byte {
	e := wireError{Message: err.Error()}
	if ds, ok := diag.As(err); ok {
		e.Diagnostics = ds
	}
	b, _ := json.Marshal(e)
	return b
}

// decodeFailure turns a child's failure answer back into the handler's
// diagnostics or message.
func decodeFailure(b []byte) error {
	var e wireError
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("%w: malformed error response", ErrCrashed)
	}
	if len(e.Diagnostics) > 0 {
		return e.Diagnostics
	}
	return errors.New(e.Message)
}

// isOOM recognises the Go runtime's out-of-memory deaths, which is how an
// exhausted RLIMIT_AS shows: mmap fails and the runtime throws (or, in a
// binary built with -race, ThreadSanitizer fails to map its shadow).
func isOOM(stderr string) bool {
	return strings.Contains(stderr, "out of memory") ||
		strings.Contains(stderr, "ThreadSanitizer failed to allocate") ||
		strings.Contains(stderr, "address space collisions") ||
		strings.Contains(stderr, "cannot allocate memory") ||
		strings.Contains(stderr, "failed to create new OS thread")
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if len(s) > 500 {
		s = "…" + s[len(s)-500:]
	}
	return ": " + s
}

// capped keeps at most max bytes and discards the rest: the last max
// bytes when keepTail is set (a session's child writes to stderr across
// many requests, and what matters is how it died), else the first.
type capped struct {
	bytes.Buffer
	max      int
	keepTail bool
}

func (c *capped) Write(p []byte) (int, error) {
	if c.keepTail {
		if len(p) >= c.max {
			c.Reset()
			c.Buffer.Write(p[len(p)-c.max:])
			return len(p), nil
		}
		if over := c.Len() + len(p) - c.max; over > 0 {
			rest := append([]byte(nil), c.Bytes()[over:]...)
			c.Reset()
			c.Buffer.Write(rest)
		}
		c.Buffer.Write(p)
		return len(p), nil
	}
	if room := c.max - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// IsChild reports whether this process was started by Run.
func IsChild() bool { return len(os.Args) >= 3 && os.Args[1] == Subcommand }

// Main runs the child side when IsChild, and then exits; otherwise it
// returns at once. Call it before anything else in main and TestMain.
func Main() {
	if !IsChild() {
		return
	}
	os.Exit(child(os.Args[2], os.Stdin, os.Stdout))
}

func child(name string, in io.Reader, out io.Writer) int {
	mem, _ := strconv.ParseUint(os.Getenv(envMemory), 10, 64)
	if mem > 0 {
		if err := limitMemory(mem); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxproc: %v\n", err)
			return 3
		}
	}
	if nice, _ := strconv.Atoi(os.Getenv(envNice)); nice > 0 {
		if err := lowerPriority(nice); err != nil {
			fmt.Fprintf(os.Stderr, "sandboxproc: %v\n", err)
			return 3
		}
	}
	mu.RLock()
	prepare := warmups
	mu.RUnlock()
	for _, f := range prepare {
		f()
	}
	if len(os.Args) >= 4 && os.Args[3] == sessionArg {
		return childSession(name, in)
	}
	br := bufio.NewReader(in)
	if name == anyName {
		// A spare (Warm): started before its work was known, it learns
		// the handler from the request's first line.
		line, err := br.ReadString('\n')
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandboxproc: reading the handler's name: %v\n", err)
			return 3
		}
		name = strings.TrimSuffix(line, "\n")
	}
	mu.RLock()
	h := handlers[name]
	mu.RUnlock()
	if h == nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: no handler %q\n", name)
		return 3
	}
	req, err := io.ReadAll(br)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxproc: reading the request: %v\n", err)
		return 3
	}
	resp, err := run(h, req)
	if err != nil {
		if _, werr := out.Write(append([]byte{statusErr}, encodeFailure(err)...)); werr != nil {
			return 3
		}
		return 0
	}
	if _, err := out.Write(append([]byte{statusOK}, resp...)); err != nil {
		return 3
	}
	return 0
}

// run calls h, turning a panic into an error (the child exits cleanly and
// the parent reports it).
func run(h Handler, req []byte) (resp []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sandboxproc: handler panicked: %v", r)
		}
	}()
	return h(context.Background(), req)
}

// limitMemory caps the address space at what is mapped now plus mem, and
// tells the garbage collector to work hard before that limit is reached.
// lowerPriority sets every thread of this process to niceness nice.
// Linux keeps a niceness per thread, and a thread takes its creator's:
// once every thread has it, every later one has it too. The threads are
// listed until a pass finds none it had not set (the runtime may start
// one meanwhile). A thread already nicer than that keeps its own (raising
// a priority back needs a privilege a child does not have).
func lowerPriority(nice int) error {
	if nice < 1 || nice > 19 {
		return fmt.Errorf("niceness %d outside 1 to 19", nice)
	}
	set := map[string]bool{}
	for {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("listing this process's threads: %w", err)
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || set[t.Name()] {
				continue
			}
			set[t.Name()], fresh = true, true
			err = syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice)
			if err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
				return fmt.Errorf("setting thread %d's niceness to %d: %w", tid, nice, err)
			}
		}
		if !fresh {
			return nil
		}
	}
}

func limitMemory(mem uint64) error {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return fmt.Errorf("reading the address space size: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return errors.New("reading the address space size: empty /proc/self/statm")
	}
	pages, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return fmt.Errorf("reading the address space size: %w", err)
	}
	lim := pages*uint64(os.Getpagesize()) + mem
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		return fmt.Errorf("setting RLIMIT_AS: %w", err)
	}
	// The soft limit makes the GC collect before mmap fails, so a call that
	// fits after collection is not killed for garbage it left behind.
	debug.SetMemoryLimit(int64(mem - mem/4))
	return nil
}
