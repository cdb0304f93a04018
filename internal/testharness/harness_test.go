package testharness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// childEnv asks TestKilledParent's helper to play the killed test binary.
const childEnv = "SCELLIS_TESTHARNESS_CHILD"

// The helper: a guarded test binary (its own root, its own reaper) that
// starts a long-lived child, makes a temporary folder, says both, and
// waits to be killed.
func TestHelperKilledBinary(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestKilledParent")
	}
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fmt.Printf("child %d dir %s root %s\n", sleeper.Process.Pid, dir, os.Getenv(RootEnv))
	time.Sleep(10 * time.Minute) // until its parent is killed
}

// SIGKILL of the process that ran a test binary (as of `go test`) ends
// the binary, the processes it started and its temporary folders.
func TestKilledParent(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("the helper's own run")
	}
	// sh plays `go test`: the test binary is its child.
	parent := exec.Command("/bin/sh", "-c", `"$0" -test.run '^TestHelperKilledBinary$' -test.v & wait`, os.Args[0])
	parent.Env = append(unmarked(os.Environ()), childEnv+"=1", "TMPDIR="+t.TempDir())
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	var dir, root string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "child %d dir %s root %s", &pid, &dir, &root); err == nil {
			break
		}
	}
	if pid == 0 || !strings.HasPrefix(dir, root) {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("the helper did not report its child and folder (pid %d, dir %q, root %q)", pid, dir, root)
	}
	parent.Process.Signal(syscall.SIGKILL)
	parent.Wait()
	go func() { // the pipe's other end is held by the killed helper until it dies
		for sc.Scan() {
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, statErr := os.Stat(root)
		alive := syscall.Kill(pid, 0) == nil
		if !alive && os.IsNotExist(statErr) {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("30 s after its parent was killed: the helper's child alive %v, its root %s there %v", alive, root, statErr == nil)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
