package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The systemd units in deploy/ pass systemd-analyze verify: no unknown or
// misspelt directive (which systemd only warns about), and ExecStart runs
// the scellis binary. They are templates (one instance per member, its
// config in /etc/scellis/NAME), allow netlink (the data plane lists
// interfaces), and the aggregator's reloads with SIGHUP (key rotation).
func TestSystemdUnitsVerify(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the deploy/systemd units are not verified here")
	}
	units, _ := filepath.Glob("../../deploy/systemd/*@.service")
	if len(units) != 3 {
		t.Fatalf("want the aggregator, silo and worker templates in deploy/systemd, found %v", units)
	}
	bin := scellisBinary(t)
	dir := t.TempDir()
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		role := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(u), "scellis-"), "@.service")
		wants := []string{"User=scellis", "ProtectSystem=strict", "NoNewPrivileges=yes", "PrivateTmp=yes", "StateDirectory=scellis/%i",
			"ExecStart=/usr/bin/scellis " + role + " --config /etc/scellis/%i/" + role + ".yaml", " AF_NETLINK"}
		if role == "aggregator" {
			wants = append(wants, "ExecReload=/bin/kill -HUP $MAINPID")
		} else if strings.Contains(s, "ExecReload=") {
			t.Errorf("%s reloads with a signal the %s does not handle (SIGHUP would end it)", u, role)
		}
		for _, want := range wants {
			if !strings.Contains(s, want) {
				t.Errorf("%s lacks %s", u, want)
			}
		}
		// verify checks that ExecStart's binary exists: point it at the one under test.
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(s, "/usr/bin/scellis", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	cmd := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || out.Len() > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out.String())
	}
}

// consecutivePorts finds n consecutive free loopback ports and returns the
// first (federation init numbers the aggregators' ports from one base).
func consecutivePorts(t testing.TB, n int) int {
	for range 500 {
		// The counter values this call owns are first..first+n-1 (ports.next
		// hands out the values after them): the run maps onto them exactly.
		first := lowPort.Add(int64(n)) - int64(n) + 1
		off := int(first % lowPortSpan)
		if off+n > lowPortSpan {
			continue
		}
		base := lowPortBase + off
		var ls []net.Listener
		for i := range n {
			if !claimPort(base + i) {
				break
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// federation init writes everything a federation needs; started from
// nothing but those files (each process from its own folder, as on its
// own machine), three aggregators elect a leader, two workers lease, and
// the researcher's pool job completes with an intact receipt chain.
func TestFederationInitStartsEverything(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federation test")
	}
	root := t.TempDir()
	base := consecutivePorts(t, 8) // 3 × (API, Raft), agg-1's health and metrics endpoints, worker-1's metrics
	mustRun(t, scellisCmd(t, root, "federation", "init", "--dir", "fed", "--aggregators", "3", "--workers", "2",
		"--researcher", "alice", "--port", fmt.Sprint(base)))
	dir := filepath.Join(root, "fed")
	for _, m := range []string{"agg-1", "agg-2", "agg-3", "worker-1", "worker-2", "alice"} {
		fi, err := os.Stat(filepath.Join(dir, m, "identity.key"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s/identity.key has mode %v, want 0600", m, fi.Mode().Perm())
		}
	}
	c := &cluster{t: t, dir: dir, aggs: []string{"agg-1", "agg-2", "agg-3"}, procs: map[string]*exec.Cmd{}, exits: map[string]chan struct{}{}}
	t.Cleanup(c.stopAll)
	// Each process runs in its own folder with its own copy of the
	// federation file, as it would on its machine.
	startIn := func(name string, args ...string) {
		log, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := scellisCmd(t, filepath.Join(dir, name), args...)
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.procs[name] = cmd
		exited := make(chan struct{})
		c.exits[name] = exited
		go func() { cmd.Wait(); log.Close(); close(exited) }()
	}
	// agg-1 also serves the health endpoints and /metrics on one address;
	// worker-1 serves /metrics, worker-2 logs JSON.
	health := fmt.Sprintf("127.0.0.1:%d", base+6)
	workerMetrics := fmt.Sprintf("127.0.0.1:%d", base+7)
	for cfg, extra := range map[string]string{
		"agg-1/aggregator.yaml": "health_listen: " + health + "\nmetrics_listen: " + health + "\n",
		"worker-1/worker.yaml":  "metrics_listen: " + workerMetrics + "\n",
		"worker-2/worker.yaml":  "log_format: json\n",
	} {
		b, err := os.ReadFile(filepath.Join(dir, cfg))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, cfg), append(b, extra...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range c.aggs {
		startIn(a, "aggregator", "--config", "aggregator.yaml")
	}
	c.waitLeader()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + health + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	waitFor(t, "agg-1 ready", untilElected(), func() bool { code, _ := get("/readyz"); return code == 200 })
	if _, body := get("/readyz"); !strings.Contains(body, `"ready":true`) || !strings.Contains(body, `"node":"agg-1"`) {
		t.Fatalf("/readyz: %s", body)
	}
	startIn("worker-1", "worker", "--config", "worker.yaml")
	startIn("worker-2", "worker", "--config", "worker.yaml")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc", 4)))
	waitFor(t, "the job to complete", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	// The pool's series: agg-1's on its health address, the workers' own.
	m := scrape(t, health)
	if m[`scellis_jobs{state="done"}`] != 1 || m["scellis_leases"] != 0 || m[`scellis_raft_state{state="shutdown"}`] != 0 ||
		m[`scellis_data_plane_bytes_total{direction="in",plane="blobs"}`] <= 0 {
		t.Fatalf("agg-1's /metrics after the job: jobs done %v, leases %v, blob bytes in %v", m[`scellis_jobs{state="done"}`], m["scellis_leases"], m[`scellis_data_plane_bytes_total{direction="in",plane="blobs"}`])
	}
	if w := scrape(t, workerMetrics); w[`scellis_worker_shards_total{event="leased"}`] < 1 || w[`scellis_worker_shards_total{event="reported"}`] < 1 {
		t.Fatalf("worker-1's /metrics after the job: %v", w)
	}
	// job watch on a finished job prints its state and its wall time by
	// the pool's clock, and returns; worker stop stops worker-1 (the
	// README's commands).
	if out := c.mustCLI("alice", "job", "watch", id); !strings.Contains(out, ": done; 4/4 verified") ||
		!regexp.MustCompile(`(?m)^done in \S+ by the pool's clock: 4/4 shards decided \(4 verified, 0 unverified\), [0-9.]+ shards/s mean$`).MatchString(out) {
		t.Fatalf("job watch of the finished job:\n%s", out)
	}
	if out := mustRun(t, scellisCmd(t, filepath.Join(dir, "worker-1"), "worker", "stop", "--config", "worker.yaml")); !strings.Contains(out, "sent stop to worker worker-1") {
		t.Fatalf("worker stop: %s", out)
	}
	c.waitExit("worker-1")
	// Shell completion: job IDs from the pool, member names.
	if out := c.mustCLI("alice", "__complete", "job", "result", ""); !strings.Contains(out, id+"\tmc, done") {
		t.Fatalf("job result did not complete the job's ID:\n%s", out)
	}
	if out := c.mustCLI("alice", "__complete", "aggregator", "leave", "agg"); !strings.Contains(out, "agg-3\taggregator") || strings.Contains(out, "worker") {
		t.Fatalf("aggregator leave did not complete the aggregators:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "worker-2.log")); !strings.Contains(string(b), `"member":"worker-2"`) {
		t.Fatalf("worker-2 (log_format: json) did not log JSON lines:\n%s", b)
	}
	if out := c.mustCLI("alice", "receipts", "verify"); !strings.Contains(out, "intact: 4 receipts") {
		t.Fatalf("receipts verify: %s", out)
	}
	c.mustCLI("alice", "job", "result", id, "--out", "result")
	if _, err := os.Stat(filepath.Join(dir, "result", "result.json")); err != nil {
		t.Fatal(err)
	}
	// Without a majority agg-1 is alive but not ready.
	c.kill("agg-2", syscall.SIGKILL)
	c.kill("agg-3", syscall.SIGKILL)
	waitFor(t, "agg-1 to say it is not ready", untilElected(), func() bool { code, _ := get("/readyz"); return code == http.StatusServiceUnavailable })
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz without a majority: %d", code)
	}
	if _, body := get("/readyz"); !strings.Contains(body, `"ready":false`) || !strings.Contains(body, "no leader") {
		t.Fatalf("/readyz without a majority: %s", body)
	}
	// Commands that must commit or read fresh fail as such: SC7103 (the
	// pool is unreachable, not an input fault), and they return (the CLI
	// gives up after its bound, 12 s, instead of retrying for minutes). Run
	// at once, they add that bound to the test once (~15 s).
	cmds := [][]string{{"job", "submit", c.montecarlo("mc-minority", 2)}, {"job", "cancel", id}, {"fl", "status", id}}
	type outcome struct {
		args []string
		errs string
		err  error
		took time.Duration
	}
	outcomes := make(chan outcome, len(cmds))
	for _, args := range cmds {
		go func() {
			began := time.Now()
			_, errs, err := c.cli("alice", args...)
			outcomes <- outcome{args, errs, err, time.Since(began)}
		}()
	}
	for range cmds {
		o := <-outcomes
		var ee *exec.ExitError
		if !errors.As(o.err, &ee) || ee.ExitCode() != 2 || !strings.Contains(o.errs, "SC7103") {
			t.Errorf("scellis %v with a majority down (%v):\n%s", o.args, o.err, o.errs)
		}
		t.Logf("scellis %v with a majority down gave up after %v", o.args, o.took.Round(100*time.Millisecond))
	}
	// At the default log level a normal start's election is not a warning
	// (Raft's logs go through slog; the first election is info).
	for _, a := range c.aggs {
		b, _ := os.ReadFile(filepath.Join(dir, a+".log"))
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "starting election") && strings.Contains(line, `last-leader-id=""`) {
				t.Errorf("%s logged its start-up election as a warning: %s", a, line)
			}
		}
	}
}

// A release build stamps its version with -ldflags, as the README says:
// the test binary is built that way (scellisBinary).
func TestVersionStampedByLdflags(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	out, err := exec.Command(scellisBinary(t), "version").Output()
	if err != nil || string(out) != "scellis "+testVersion+"\n" {
		t.Fatalf("scellis version: %q %v", out, err)
	}
}
