package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/trainer"
)

// unitDirectives returns a unit file's [Service] assignments, in order, as
// key and value (comments and other sections left out).
func unitDirectives(t *testing.T, path string) [][2]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not a directive: %q", path, line)
			}
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

// The packaged silo unit stays tight by default (no namespaces, no mount
// system calls, no writable-and-executable memory), and the shipped
// drop-in that lets a silo run trainers allows exactly what the trainer
// sandbox makes — the namespaces and set-up system calls package trainer
// uses (trainer.Namespaces, trainer.SetupSyscalls) — plus PyTorch's
// run-time code, and loosens nothing else. systemd-analyze verify accepts
// an instance with the drop-in.
func TestSiloTrainersDropIn(t *testing.T) {
	t.Parallel()
	silo := unitDirectives(t, "../../deploy/systemd/scellis-silo@.service")
	for _, want := range [][2]string{
		{"RestrictNamespaces", "yes"}, {"SystemCallFilter", "@system-service"}, {"MemoryDenyWriteExecute", "yes"},
		{"NoNewPrivileges", "yes"}, {"CapabilityBoundingSet", ""}, {"ProtectSystem", "strict"}, {"PrivateDevices", "yes"},
	} {
		if !slices.Contains(silo, want) {
			t.Errorf("the silo unit lacks %s=%s (its default stays tight; trainers need the drop-in)", want[0], want[1])
		}
	}
	drop := unitDirectives(t, "../../deploy/systemd/scellis-silo-trainers.conf")
	var ns []string
	var calls []string
	for _, d := range drop {
		switch d[0] {
		case "RestrictNamespaces":
			ns = strings.Fields(d[1]) // an empty assignment resets the unit's "yes"
		case "SystemCallFilter":
			calls = append(calls, strings.Fields(d[1])...)
		case "MemoryDenyWriteExecute":
			if d[1] != "no" {
				t.Errorf("the drop-in sets MemoryDenyWriteExecute=%s; PyTorch's convolutions need it off", d[1])
			}
		default:
			t.Errorf("the drop-in sets %s=%s: it loosens only namespaces, system calls and W+X memory", d[0], d[1])
		}
	}
	if !slices.Contains(drop, [2]string{"RestrictNamespaces", ""}) || drop[0] != [2]string{"RestrictNamespaces", ""} {
		t.Errorf("the drop-in must reset RestrictNamespaces= first (a list after the unit's yes would not replace it): %v", drop)
	}
	slices.Sort(ns)
	want := trainer.Namespaces()
	slices.Sort(want)
	if !slices.Equal(ns, want) {
		t.Errorf("the drop-in allows namespaces %v; the sandbox makes %v", ns, want)
	}
	slices.Sort(calls)
	wantCalls := slices.Clone(trainer.SetupSyscalls)
	slices.Sort(wantCalls)
	if !slices.Equal(calls, wantCalls) {
		t.Errorf("the drop-in adds system calls %v; the sandbox's set-up needs %v beyond @system-service", calls, wantCalls)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit with its drop-in is not verified here")
	}
	dir := t.TempDir()
	unit, err := os.ReadFile("../../deploy/systemd/scellis-silo@.service")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile("../../deploy/systemd/scellis-silo-trainers.conf")
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart's binary exists: point it at the one under test.
	unit = bytes.ReplaceAll(unit, []byte("/usr/bin/scellis"), []byte(scellisBinary(t)))
	if err := os.WriteFile(filepath.Join(dir, "scellis-silo@.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "scellis-silo@silo-1.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "scellis-silo@silo-1.service.d", "trainers.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", "scellis-silo@silo-1.service")
	// The trailing colon keeps systemd's own unit folders after ours.
	cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
	out, err := cmd.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify of the silo unit with the trainers drop-in: %v\n%s", err, out)
	}
}

// testCgroups gives a process cgroups of its own, under the test's, in
// every hierarchy mounted on this machine, so systemd booted in a cgroup
// namespace (TestSiloUnitRunsTrainers) makes its slices there and nowhere
// else; remove deletes them once their processes are gone.
type testCgroups struct {
	dirs  []string // one per hierarchy, on the host
	lines []string // "BASE OPTIONS" for boot.sh: how to mount each inside
}

func newTestCgroups(t *testing.T) *testCgroups {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("no /proc/self/mountinfo: %v", err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	paths := map[string]string{} // controllers ("cpu,cpuacct", "name=systemd", "" for v2) → this process's cgroup
	for _, l := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 {
			paths[f[1]] = f[2]
		}
	}
	cg := &testCgroups{}
	name := fmt.Sprintf("scellis-test-%d", os.Getpid())
	for _, l := range strings.Split(string(mounts), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		var ctl, opts string
		switch g[0] {
		case "cgroup2":
			ctl, opts = "", "cgroup2"
		case "cgroup":
			var ctls, named []string
			for _, o := range strings.Split(g[2], ",") {
				switch {
				case strings.HasPrefix(o, "name="):
					named = append(named, o)
				case o == "rw" || o == "ro" || o == "xattr" || strings.Contains(o, "="):
				default:
					ctls = append(ctls, o)
				}
			}
			ctl = strings.Join(append(slices.Clone(ctls), named...), ",")
			if len(ctls) == 0 {
				ctls = []string{"none"} // a named hierarchy without controllers
			}
			opts = strings.Join(append(ctls, named...), ",")
		default:
			continue
		}
		p, ok := paths[ctl]
		if !ok {
			continue
		}
		dir := filepath.Join(f[4], p, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			cg.remove(t)
			t.Skipf("cannot make a cgroup of the test's own (%v): systemd is not booted here", err)
		}
		cg.dirs = append(cg.dirs, dir)
		// cpuset: a new cgroup has no CPUs or memory nodes until given
		// its parent's, and takes no process before.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					cg.remove(t)
					t.Skipf("cannot set up a cpuset cgroup of the test's own: %v", err)
				}
			}
		}
		cg.lines = append(cg.lines, filepath.Base(f[4])+" "+opts)
	}
	if len(cg.dirs) == 0 {
		t.Skip("no cgroup hierarchy is mounted: systemd is not booted here")
	}
	return cg
}

// enter moves pid into every one of the test's cgroups.
func (c *testCgroups) enter(t *testing.T, pid int) {
	t.Helper()
	for _, d := range c.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatalf("moving the boot process into %s: %v", d, err)
		}
	}
}

// remove deletes the test's cgroups, deepest first, waiting for the
// processes killed in them to leave.
func (c *testCgroups) remove(t *testing.T) {
	for _, top := range c.dirs {
		var all []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		slices.Reverse(all)
		for _, d := range all {
			deadline := time.Now().Add(untilExit())
			for {
				err := syscall.Rmdir(d)
				if err == nil || os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("removing the test's cgroup %s: %v", d, err)
					break
				}
				time.Sleep(50 * time.Millisecond) // the killed processes leave the cgroup
			}
		}
	}
}

// The packaged silo unit, run by systemd itself: a silo installed from
// the package (scellis-silo@.service, every hardening directive as
// shipped, User=scellis) declines a trainer with SC9509 — its unit forbids
// the sandbox — and with the shipped drop-in
// (deploy/systemd/scellis-silo-trainers.conf) runs the walkthrough's
// PyTorch CNN in the sandbox and writes the trained weights. systemd 252+
// is booted as PID 1 of its own namespaces on a volatile overlay of this
// machine's root (testdata/systemd/boot.sh): nothing it does reaches the
// host. Each instance runs `scellis trainer train` in place of the silo
// (the same trainer.Run a silo's round calls), as a oneshot. Needs root,
// unshare, nsenter, systemd and Debian's python3-torch.
func TestSiloUnitRunsTrainers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("boots systemd and trains a CNN")
	}
	needTorch(t)
	if os.Getuid() != 0 {
		t.Skip("booting systemd in namespaces needs root")
	}
	for _, p := range []string{"/lib/systemd/systemd", "/usr/bin/unshare", "/usr/bin/nsenter", "/bin/systemctl"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s: systemd is not booted here", p)
		}
	}
	if fs, _ := os.ReadFile("/proc/filesystems"); !bytes.Contains(fs, []byte("\toverlay\n")) {
		t.Skip("no overlay file system: systemd is not booted here")
	}
	// A container without the privilege to make namespaces and mount
	// cannot boot systemd in them.
	if out, err := exec.Command("/usr/bin/unshare", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc", "--cgroup", "--propagation", "private",
		"/bin/sh", "-c", "mount -t tmpfs tmpfs /mnt").CombinedOutput(); err != nil {
		t.Skipf("cannot make namespaces and mount here (%v: %s): systemd is not booted here", err, out)
	}
	bin := scellisBinary(t)
	stage := t.TempDir()
	mustRun(t, scellisCmd(t, stage, "datagen", "glyphs", "--sites", "1", "--rows", "120", "--test", "40", "--out", "data"))
	if err := os.CopyFS(filepath.Join(stage, "cnn"), os.DirFS("../../examples/trainer-cnn")); err != nil {
		t.Fatal(err)
	}
	mustRun(t, scellisCmd(t, stage, "trainer", "init", "cnn"))
	copyFile := func(from, to string, mode os.FileMode) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stage, to), b, mode); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(bin, "scellis", 0o755)
	copyFile("../../deploy/systemd/scellis-silo@.service", "silo.service", 0o644)
	copyFile("../../deploy/systemd/scellis-silo-trainers.conf", "trainers.conf", 0o644)
	// The test's own drop-in, for every instance: the silo's ExecStart
	// becomes one training run (as a oneshot, its output in /run), and
	// the boot's targets are not pulled in. Every hardening directive is
	// the unit's.
	test := `[Unit]
DefaultDependencies=no
[Service]
Type=oneshot
RemainAfterExit=yes
Restart=no
ExecStart=
ExecStart=/usr/bin/scellis trainer train /srv/scellis/cnn --data /srv/scellis/data/site-1.csv --param epochs=1 --out /var/lib/scellis/%i/w.npy
StandardOutput=append:/run/trainer-%i.log
StandardError=inherit
`
	if err := os.WriteFile(filepath.Join(stage, "test.conf"), []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	cg := newTestCgroups(t)
	t.Cleanup(func() { cg.remove(t) })
	if err := os.WriteFile(filepath.Join(stage, "cgroups"), []byte(strings.Join(cg.lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	boot := exec.Command("/bin/sh", "testdata/systemd/boot.sh", stage)
	var bootLog bytes.Buffer
	boot.Stdout, boot.Stderr = &bootLog, &bootLog
	goAhead, err := boot.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	boot.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := boot.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { boot.Wait(); close(exited) }()
	cg.enter(t, boot.Process.Pid)
	fmt.Fprintln(goAhead, "go")
	goAhead.Close()
	// systemd is the first child of unshare (boot.sh's process, after its
	// exec), PID 1 of the new namespaces; killing it ends them.
	systemd := 0
	t.Cleanup(func() {
		if systemd > 0 {
			_ = syscall.Kill(systemd, syscall.SIGKILL)
		}
		_ = syscall.Kill(-boot.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	waitFor(t, "systemd to start in its namespaces", untilElected(), func() bool {
		select {
		case <-exited:
			t.Fatalf("boot.sh ended before systemd started:\n%s", bootLog.String())
		default:
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", boot.Process.Pid, boot.Process.Pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b))
		if len(f) != 1 {
			return false
		}
		comm, _ := os.ReadFile("/proc/" + f[0] + "/comm")
		if strings.TrimSpace(string(comm)) != "systemd" {
			return false
		}
		systemd, _ = strconv.Atoi(f[0])
		return true
	})
	inside := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "/usr/bin/nsenter", append([]string{"-t", strconv.Itoa(systemd), "-m", "-p", "--"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	waitFor(t, "systemd to be running", untilElected(), func() bool {
		out, _ := inside(context.Background(), "systemctl", "is-system-running")
		s := strings.TrimSpace(out)
		return s == "running" || s == "degraded"
	})
	run := func(instance string) (started bool, log string) {
		ctx, cancel := context.WithTimeout(context.Background(), untilRun())
		defer cancel()
		_, err := inside(ctx, "systemctl", "start", "scellis-silo@"+instance+".service")
		if ctx.Err() != nil {
			t.Fatalf("scellis-silo@%s did not finish within %v", instance, untilRun())
		}
		log, _ = inside(context.Background(), "cat", "/run/trainer-"+instance+".log")
		return err == nil, log
	}

	// As packaged: the unit forbids the sandbox's namespaces, so the
	// silo declines (it never runs the trainer unsandboxed).
	if ok, log := run("tight"); ok || !strings.Contains(log, "SC9509") {
		t.Fatalf("scellis-silo@tight (the unit as packaged) should decline with SC9509; started %v, its output:\n%s", ok, log)
	}
	// With the drop-in: the CNN trains, as the scellis user, and writes
	// its weights (2 650 float32 or float64 and the .npy header).
	ok, log := run("trainers")
	if !ok {
		t.Fatalf("scellis-silo@trainers (the unit with the drop-in) failed; its output:\n%s", log)
	}
	st, err := inside(context.Background(), "stat", "-c", "%U %s", "/var/lib/scellis/trainers/w.npy")
	if err != nil {
		t.Fatalf("the trained weights: %v %s\n%s", err, st, log)
	}
	var owner string
	var size int
	if _, err := fmt.Sscan(st, &owner, &size); err != nil || owner != "scellis" || size < 2650*4 {
		t.Fatalf("the trained weights are %q, want a file of scellis's of at least %d bytes\n%s", strings.TrimSpace(st), 2650*4, log)
	}
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		t.Log(sc.Text())
	}
}
