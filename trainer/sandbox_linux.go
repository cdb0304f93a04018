package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/scellis/scellis/diag"
)

// Subcommand is the hidden argv[1] that makes a process a trainer
// sandbox's first process (Main).
const Subcommand = "__trainer-sandbox"

// Executable returns the binary re-executed as the sandbox's first
// process (tests may replace it).
var Executable = os.Executable

// setup is what the parent tells the sandbox's first process.
type setup struct {
	Root        string   `json:"root"`        // empty folder: the tmpfs root is mounted here
	Binds       []bind   `json:"binds"`       // host path → sandbox path
	Interpreter string   `json:"interpreter"` // inside the sandbox (a system directory's)
	Args        []string `json:"args"`
	Env         []string `json:"env"`
	Limits      Limits   `json:"limits"`
	MaxFile     uint64   `json:"max_file"` // RLIMIT_FSIZE
	UserNS      bool     `json:"user_ns"`  // in a user namespace (the silo is not root)
}

type bind struct {
	From, To string
	Write    bool
	File     bool
}

// systemDirs are bound read-only so the interpreter and its libraries
// (numpy, torch, BLAS through /etc/alternatives) load: software, not the
// silo's data. Those missing on the host are skipped.
var systemDirs = []string{"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"}

// Run runs one mode of a trainer in the sandbox and returns its checked
// answer. Every failure is a diagnostic with its SC95xx code.
func Run(ctx context.Context, j Job) (Result, error) {
	subject := j.subject()
	lim := j.Limits.WithDefaults()
	if err := os.MkdirAll(j.Dir, 0o700); err != nil {
		return Result{}, sandboxErr(subject, "making the job folder: %v", err)
	}
	dir, err := os.MkdirTemp(j.Dir, "trainer-")
	if err != nil {
		return Result{}, sandboxErr(subject, "making the job folder: %v", err)
	}
	defer os.RemoveAll(dir)
	if err := writeInputs(dir, j); err != nil {
		return Result{}, sandboxErr(subject, "writing the trainer's inputs: %v", err)
	}
	root := os.Getuid() == 0
	su := setup{
		Root:        filepath.Join(dir, "root"),
		Interpreter: j.Interpreter,
		Args:        []string{j.Interpreter, "-B", "-s", sandboxTrainer + "/" + j.Bundle.Entry, j.Mode},
		Env: []string{"PATH=/usr/bin:/bin", "HOME=" + sandboxScratch, "TMPDIR=" + sandboxScratch, "LANG=C.UTF-8",
			"PYTHONPATH=" + sandboxHelper, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "SCELLIS_IO=" + sandboxIO,
			"OMP_NUM_THREADS=" + strconv.Itoa(lim.Threads), "OPENBLAS_NUM_THREADS=" + strconv.Itoa(lim.Threads), "MKL_NUM_THREADS=" + strconv.Itoa(lim.Threads)},
		Limits:  lim,
		MaxFile: uint64(16*len(j.Weights)) + 64<<20,
		UserNS:  !root,
	}
	for _, d := range systemDirs {
		if st, err := os.Stat(d); err == nil {
			su.Binds = append(su.Binds, bind{From: d, To: d, File: !st.IsDir()})
		}
	}
	su.Binds = append(su.Binds,
		bind{From: filepath.Join(dir, "trainer"), To: sandboxTrainer},
		bind{From: filepath.Join(dir, "lib"), To: sandboxHelper},
		bind{From: filepath.Join(dir, "io"), To: sandboxIO, Write: true})
	if j.Data != "" {
		su.Binds = append(su.Binds, bind{From: j.Data, To: sandboxData + "/" + filepath.Base(j.Data), File: true})
	}
	req, _ := json.Marshal(su)
	exe, err := Executable()
	if err != nil {
		return Result{}, sandboxErr(subject, "finding this binary: %v", err)
	}
	cmd := exec.Command(exe, Subcommand)
	cmd.Env = []string{}
	cmd.Stdin = bytes.NewReader(req)
	log := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = log, log
	attr := &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
	}
	if !root {
		// Unprivileged: a user namespace in which the silo's user is
		// root, so the first process can mount and bind.
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, sandboxErr(subject, "starting the sandbox (new user, mount and network namespaces): %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	wall := time.NewTimer(lim.Wall)
	defer wall.Stop()
	var waitErr error
	timedOut := false
	select {
	case waitErr = <-done:
	case <-wall.C:
		timedOut = true
	case <-ctx.Done():
	}
	if waitErr == nil && (timedOut || ctx.Err() != nil) {
		// The first process is PID 1 of the sandbox's PID namespace:
		// killing it ends every process the trainer started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		waitErr = <-done
		if !timedOut {
			return Result{}, ctx.Err()
		}
	}
	took := time.Since(start)
	out := log.String()
	fail := func(code diag.Code, help, format string, args ...any) (Result, error) {
		d := diag.New(code, subject, format, args...).WithHelp("%s", help)
		if t := tail(out, 2000); t != "" {
			d.Message += "; its output ends: " + t
		}
		return Result{Log: out, Took: took}, d
	}
	if timedOut {
		return fail(diag.TrainerTimeout, "train less per round (epochs, batch size), or the silo's operator raises the trainer's wall limit in policy.trainers",
			"the trainer ran past its wall-clock limit of %v and was killed", lim.Wall)
	}
	if waitErr != nil {
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
				switch {
				case ws.Signaled() && (ws.Signal() == syscall.SIGXCPU || ws.Signal() == syscall.SIGKILL):
					return fail(diag.TrainerCPU, "train less per round, or the silo's operator raises cpu_seconds in policy.trainers",
						"the trainer used up its CPU time of %d s (%v)", lim.CPUSeconds, ws.Signal())
				case ws.ExitStatus() == setupFailed:
					return fail(diag.TrainerSandbox, "the silo needs Linux user, mount and network namespaces (root, or unprivileged user namespaces); see docs/trainers.md",
						"the sandbox could not be set up")
				}
			}
		}
		if memoryDeath(out) {
			return fail(diag.TrainerMemory, "use a smaller model or batch, or the silo's operator raises memory_mb in policy.trainers",
				"the trainer ran out of its %d MiB of memory", lim.MemoryMB)
		}
		return fail(diag.TrainerCrashed, "run the trainer on sample data with scellis trainer train DIR --data FILE to see the error",
			"the trainer failed: %v", waitErr)
	}
	r, err := readOutputs(dir, j, subject)
	r.Log, r.Took = out, took
	return r, err
}

func sandboxErr(subject, format string, args ...any) error {
	return diag.New(diag.TrainerSandbox, subject, format, args...).
		WithHelp("the silo needs Linux user, mount and network namespaces (root, or unprivileged user namespaces); see docs/trainers.md")
}

// setupFailed is the first process's exit status when the sandbox could
// not be made (nothing of the trainer ran).
const setupFailed = 97

// Main runs the sandbox's first process when this process was started as
// one (argv[1] is Subcommand), and exits; otherwise it returns at once.
// Call it first thing in main and in TestMain of a test binary that runs
// trainers.
func Main() {
	if len(os.Args) < 2 || os.Args[1] != Subcommand {
		return
	}
	var su setup
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20)).Decode(&su); err != nil {
		fmt.Fprintf(os.Stderr, "scellis sandbox: reading the setup: %v\n", err)
		os.Exit(setupFailed)
	}
	err := enter(su)
	fmt.Fprintf(os.Stderr, "scellis sandbox: %v\n", err)
	os.Exit(setupFailed)
}

// enter builds the sandbox's file system in the new mount namespace, sets
// the limits, drops privileges and executes the interpreter. It returns
// only on failure.
func enter(su setup) error {
	// Capabilities are per thread: the thread that drops them is the one
	// that executes the interpreter.
	runtime.LockOSThread()
	// Nothing mounted here propagates to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	r := su.Root
	if err := unix.Mount("tmpfs", r, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m,mode=0755"); err != nil {
		return fmt.Errorf("mounting the root: %w", err)
	}
	for _, b := range su.Binds {
		to := filepath.Join(r, b.To)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if b.File {
			if err := os.WriteFile(to, nil, 0o444); err != nil {
				return err
			}
		} else if err := os.MkdirAll(to, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(b.From, to, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", b.To, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
		if !b.Write {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", to, "", flags, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", b.To, err)
		}
	}
	for _, d := range []string{"dev", "proc", "tmp", "scratch", "etc", ".old"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			return err
		}
	}
	for _, dev := range []string{"null", "zero", "urandom", "random"} {
		to := filepath.Join(r, "dev", dev)
		if err := os.WriteFile(to, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+dev, to, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", dev, err)
		}
	}
	scratch := fmt.Sprintf("size=%dm,mode=1777", su.Limits.ScratchMB)
	for _, d := range []string{"tmp", "scratch"} {
		if err := unix.Mount("tmpfs", filepath.Join(r, d), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, scratch); err != nil {
			return fmt.Errorf("mounting /%s: %w", d, err)
		}
	}
	if err := os.WriteFile(filepath.Join(r, "etc", "passwd"), []byte("root:x:0:0::/scratch:/bin/false\nnobody:x:65534:65534::/scratch:/bin/false\n"), 0o444); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r, "etc", "group"), []byte("root:x:0:\nnogroup:x:65534:\n"), 0o444); err != nil {
		return err
	}
	if err := unix.PivotRoot(r, filepath.Join(r, ".old")); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := mountProc(su.UserNS); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's file system: %w", err)
	}
	_ = os.Remove("/.old")
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making the root read-only: %w", err)
	}
	if err := os.Chdir(sandboxScratch); err != nil {
		return err
	}
	lim := su.Limits
	cpu := uint64(lim.CPUSeconds)
	for _, l := range []struct {
		res      int
		cur, max uint64
	}{
		{unix.RLIMIT_CPU, cpu, cpu + 1},
		{unix.RLIMIT_FSIZE, su.MaxFile, su.MaxFile},
		{unix.RLIMIT_CORE, 0, 0},
		{unix.RLIMIT_NOFILE, 1024, 1024},
	} {
		if err := unix.Setrlimit(l.res, &unix.Rlimit{Cur: l.cur, Max: l.max}); err != nil {
			return fmt.Errorf("setting limit %d: %w", l.res, err)
		}
	}
	// The trainer keeps the silo's user (root, or the user the user
	// namespace maps to root), so it reads the dataset file as its owner
	// does, but without any capability: the bounding set is emptied, so
	// the interpreter gains none when executed, and no_new_privs keeps a
	// set-user-ID file from granting any.
	for c := 0; c <= 63; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	var none [2]unix.CapUserData // version 3 takes two words
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &none[0]); err != nil {
		return fmt.Errorf("dropping capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return limitAndExec(su)
}

// limitAndExec sets the trainer's address-space limit and executes the
// interpreter. Once RLIMIT_AS is set, this Go process may be past it
// (its reserved heap arenas count), so from there on nothing may
// allocate: a heap that grows then ends in the runtime's fatal "out of
// memory" instead of the trainer (seen in CI, inside syscall.Exec's
// own copying of argv). Everything execve needs is built first, and the
// limit and execve are raw system calls.
func limitAndExec(su setup) error {
	if _, err := os.Stat(su.Interpreter); err != nil {
		return fmt.Errorf("the interpreter: %w", err)
	}
	path, err := unix.BytePtrFromString(su.Interpreter)
	if err != nil {
		return err
	}
	argv, err := syscall.SlicePtrFromStrings(su.Args)
	if err != nil {
		return err
	}
	envv, err := syscall.SlicePtrFromStrings(su.Env)
	if err != nil {
		return err
	}
	as := unix.Rlimit{Cur: uint64(su.Limits.MemoryMB) << 20, Max: uint64(su.Limits.MemoryMB) << 20}
	// No collection starts between here and execve.
	debug.SetGCPercent(-1)
	if _, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_AS, uintptr(unsafe.Pointer(&as)), 0, 0, 0); e != 0 {
		return fmt.Errorf("setting the address-space limit: %w", e)
	}
	_, _, e := unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(path)), uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])))
	runtime.KeepAlive(path)
	runtime.KeepAlive(argv)
	runtime.KeepAlive(envv)
	return fmt.Errorf("executing %s: %w", su.Interpreter, e)
}

// mountProc gives the sandbox a /proc. This process is PID 1 of a new PID
// namespace: a new proc shows the sandbox's processes only (read-only:
// /proc/sys's files are writable by their owner, root). In a user
// namespace the kernel refuses a new proc when the silo's own /proc is
// partly masked (as in a container); the sandbox then gets only the
// host's cpuinfo and meminfo, which PyTorch and BLAS read to size
// themselves, bound from the old root before it is detached — never a
// process list.
func mountProc(userNS bool) error {
	err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "")
	if err == nil || !userNS || !errors.Is(err, unix.EPERM) {
		if err != nil {
			return fmt.Errorf("mounting /proc: %w", err)
		}
		return nil
	}
	for _, f := range []string{"cpuinfo", "meminfo"} {
		to := "/proc/" + f
		if err := os.WriteFile(to, nil, 0o444); err != nil {
			return err
		}
		if err := unix.Mount("/.old/proc/"+f, to, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /proc/%s: %w", f, err)
		}
		if err := unix.Mount("", to, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("making /proc/%s read-only: %w", f, err)
		}
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
