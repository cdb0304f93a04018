// Package testharness ties what a test binary starts to its life: every
// process it starts (and theirs) and every temporary folder it makes end
// when it ends, however it ends — a failed test, a panic, a timeout, or
// SIGKILL of `go test` itself.
//
// A package's TestMain runs its tests through Main (or Wrap, for a
// wrapper such as goleak.VerifyTestMain). That:
//
//   - asks the kernel to kill the test binary when its parent (`go test`)
//     dies (PR_SET_PDEATHSIG), which `go test` does not do;
//   - makes one temporary root for the binary and points TMPDIR at it, so
//     t.TempDir, os.MkdirTemp and every child's temporary files land
//     there, and marks the environment every child inherits with it
//     (SCELLIS_TEST_ROOT);
//   - starts a reaper, a shell in its own session holding the read end of
//     a pipe whose write end only the test binary holds. When the binary
//     ends the pipe closes, and the reaper kills every process whose
//     environment carries the mark — children, grandchildren, sandbox
//     children — and removes the root.
//
// The mark, not a parent-death signal on each child, finds the children:
// a parent-death signal fires when the parent *thread* ends, and Go ends
// the threads of goroutines that exit locked to them (the netns tests'
// dialers do), which would kill a child started from that thread
// mid-test.
package testharness

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// RootEnv marks the environment of every process a test binary starts:
// its value is the binary's temporary root.
const RootEnv = "SCELLIS_TEST_ROOT"

// reapScript waits for its stdin to close (the test binary ended), then
// kills every process marked with the root ($1) and removes the root. It
// tries again while a marked process is still found: one being killed
// can still hold files in the root for a moment.
const reapScript = `cat >/dev/null
i=0
while [ $i -lt 50 ]; do
  found=
  for p in /proc/[0-9]*; do
    if grep -qzxF "` + RootEnv + `=$1" "$p/environ" 2>/dev/null; then kill -9 "${p#/proc/}" 2>/dev/null; found=1; fi
  done
  rm -rf "$1" 2>/dev/null
  if [ -z "$found" ] && [ ! -e "$1" ]; then exit 0; fi
  i=$((i+1))
  sleep 0.1
done
`

// runner is what testing.M and goleak's wrappers have in common.
type runner interface{ Run() int }

type guarded struct{ m runner }

// Wrap returns m whose Run guards the tests it runs (see the package
// comment): for TestMains that hand m to another wrapper.
func Wrap(m runner) runner { return guarded{m} }

// Main runs m's tests guarded and exits with their code.
func Main(m runner) { os.Exit(Wrap(m).Run()) }

// keep holds the write end of the reaper's pipe for the life of the
// process (an unreferenced *os.File would be closed by its finalizer).
var keep *os.File

func (g guarded) Run() int {
	done, err := guard()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testharness: %v; children and temporary folders may outlive a killed test\n", err)
	}
	code := g.m.Run()
	done()
	return code
}

// guard sets the test binary up as the package comment says and returns
// what its normal end does: close the pipe and wait for the reaper.
func guard() (func(), error) {
	if os.Getenv(RootEnv) != "" {
		// A test binary run by another test (a test of the harness): the
		// outer reaper already covers it.
		return func() {}, nil
	}
	parent := os.Getppid()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return func() {}, fmt.Errorf("parent-death signal: %w", err)
	}
	if os.Getppid() != parent {
		os.Exit(1) // go test died before the signal was set
	}
	root, err := os.MkdirTemp("", "scellis-test-")
	if err != nil {
		return func() {}, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return func() {}, err
	}
	reaper := exec.Command("/bin/sh", "-c", reapScript, "scellis-test-reaper", root)
	reaper.Stdin = r
	reaper.Env = unmarked(os.Environ())
	reaper.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not signalled with the terminal's group
	if err := reaper.Start(); err != nil {
		r.Close()
		w.Close()
		return func() {}, fmt.Errorf("reaper: %w", err)
	}
	r.Close()
	keep = w
	os.Setenv("TMPDIR", root)
	os.Setenv(RootEnv, root)
	return func() {
		keep.Close()
		reaper.Wait()
	}, nil
}

// unmarked is env without the mark: the reaper must not kill itself.
func unmarked(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, RootEnv+"=") && !strings.HasPrefix(kv, "TMPDIR=") {
			out = append(out, kv)
		}
	}
	return out
}
