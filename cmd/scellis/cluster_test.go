package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cluster is a federation of real scellis processes on 127.0.0.1, made
// and driven through the CLI the way an operator would.
type cluster struct {
	t     testing.TB
	dir   string
	aggs  []string
	procs map[string]*exec.Cmd
	exits map[string]chan struct{}
	// netns, when set, runs a member's processes and CLI calls in that
	// network namespace (p2p_netns_test.go).
	netns map[string]string
	// env, when set, adds variables to a member's processes (start), e.g.
	// a SCELLIS_TEST_FAULT (fl_he_e2e_test.go).
	env map[string][]string
	// nice, when set, runs a member's processes (start) at that niceness:
	// on one test machine, the stand-in for a member on a machine of its
	// own, whose CPU load is not the others' (share_e2e_test.go).
	nice map[string]int
}

// inNetns makes cmd run in member's network namespace, if it has one.
func (c *cluster) inNetns(member string, cmd *exec.Cmd) *exec.Cmd {
	if ns := c.netns[member]; ns != "" {
		ip, _ := exec.LookPath("ip")
		cmd.Args = append([]string{ip, "netns", "exec", ns}, cmd.Args...)
		cmd.Path = ip
	}
	return cmd
}

// ports hands out distinct free loopback ports: each listener stays open
// until release, so the kernel cannot give the same port twice.
type ports struct {
	t  testing.TB
	ls []net.Listener
}

func (p *ports) next() string {
	// Below the kernel's ephemeral range (32768 and up on Linux): a port
	// handed out there can be taken, while its process is down, as the
	// source port of some outgoing connection, and a restarted node then
	// cannot listen on it.
	for range 2000 {
		port := lowPortBase + int(lowPort.Add(1))%lowPortSpan
		if !claimPort(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			p.ls = append(p.ls, l)
			return l.Addr().String()
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.t.Fatal(err)
	}
	p.ls = append(p.ls, l)
	return l.Addr().String()
}

// Low ports are handed out in sequence from a point that differs between
// test processes, so that packages tested at once rarely try the same.
const (
	lowPortBase = 12000
	lowPortSpan = 20000
)

var lowPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()*997) % lowPortSpan)
	return &n
}()

// claimPort reserves port for the rest of this test process against every
// other test process on the machine: a listener on an abstract Unix
// socket named after the port (Linux: no file, machine-wide within the
// network namespace), held until the process exits — the kernel drops it
// then, so a crashed run leaves nothing behind. A TCP listener alone
// cannot do this: a node's port is free while the node is down for a
// restart, or between release and the node's own bind, and a second `go
// test` of this package (CI's fault-survival rerun, a developer's loop)
// could take it then.
func claimPort(port int) bool {
	l, err := net.Listen("unix", "@scellis-test-port-"+strconv.Itoa(port))
	if err != nil {
		return false // another test process holds it
	}
	claimed.Lock()
	claimed.ls = append(claimed.ls, l) // kept open: the claim lives as long as the process
	claimed.Unlock()
	return true
}

var claimed struct {
	sync.Mutex
	ls []net.Listener
}

func (p *ports) release() {
	for _, l := range p.ls {
		l.Close()
	}
}

// member is one entry of the federation file.
type member struct {
	name, role string
}

// siloMembers is a silo member for each name.
func siloMembers(names []string) []member {
	ms := make([]member, 0, len(names))
	for _, s := range names {
		ms = append(ms, member{s, "silo"})
	}
	return ms
}

// newCluster makes keys with `scellis keygen` and a federation file.
func newCluster(t testing.TB, regime string, aggs int, others ...member) *cluster {
	c := &cluster{t: t, dir: t.TempDir(), procs: map[string]*exec.Cmd{}, exits: map[string]chan struct{}{}}
	var fed strings.Builder
	fmt.Fprintf(&fed, "federation: test\nregime: %s\nmembers:\n", regime)
	var all []member
	for i := 1; i <= aggs; i++ {
		name := fmt.Sprintf("agg-%d", i)
		c.aggs = append(c.aggs, name)
		all = append(all, member{name, "aggregator"})
	}
	all = append(all, others...)
	pp := &ports{t: t}
	defer pp.release()
	for _, m := range all {
		pub := c.keygen(m.name)
		fmt.Fprintf(&fed, "  - name: %s\n    role: %s\n    public_key: %s\n", m.name, m.role, pub)
		if m.role == "aggregator" {
			fmt.Fprintf(&fed, "    address: %s\n    raft_address: %s\n", pp.next(), pp.next())
			c.write(m.name+".yaml", fmt.Sprintf("name: %s\nidentity: %s/identity.key\nfederation: federation.yaml\ndata_dir: %s/data\nlease_ttl: 2s\nround_join_timeout: 4s\nlog_level: error\n", m.name, m.name, m.name))
		} else {
			c.write(m.name+".yaml", fmt.Sprintf("name: %s\nidentity: %s/identity.key\nfederation: federation.yaml\ncache_dir: %s/cache\nparallel: 1\npoll: 100ms\n", m.name, m.name, m.name))
		}
	}
	c.write("federation.yaml", fed.String())
	t.Cleanup(c.stopAll)
	return c
}

func (c *cluster) keygen(name string) string {
	out := mustRun(c.t, scellisCmd(c.t, c.dir, "keygen", "--out", name, "--name", name, "--json"))
	var k struct {
		PublicKey string `json:"public_key"`
	}
	if err := json.Unmarshal([]byte(out), &k); err != nil || k.PublicKey == "" {
		c.t.Fatalf("keygen output: %q %v", out, err)
	}
	return k.PublicKey
}

func (c *cluster) write(name, body string) {
	if err := os.WriteFile(filepath.Join(c.dir, name), []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// start runs `scellis <args...>` in the background as name, logging to name.log.
func (c *cluster) start(name string, args ...string) {
	log, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := c.inNetns(name, scellisCmd(c.t, c.dir, args...))
	if n := c.nice[name]; n != 0 {
		niceBin, err := exec.LookPath("nice")
		if err != nil {
			c.t.Fatal(err)
		}
		cmd.Args = append([]string{niceBin, "-n", strconv.Itoa(n)}, cmd.Args...)
		cmd.Path = niceBin
	}
	cmd.Env = append(cmd.Env, c.env[name]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.procs[name] = cmd
	exited := make(chan struct{})
	c.exits[name] = exited
	go func() {
		cmd.Wait()
		log.Close()
		close(exited)
	}()
}

// waitExit waits for a process started by start to exit.
func (c *cluster) waitExit(name string) {
	select {
	case <-c.exits[name]:
	case <-time.After(untilExit()):
		// Ask the Go runtime for every goroutine's stack (SIGQUIT), so
		// the failure shows what the process was stuck on.
		c.kill(name, syscall.SIGQUIT)
		select {
		case <-c.exits[name]:
		case <-time.After(10 * time.Second):
		}
		b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
		if i := bytes.Index(b, []byte("SIGQUIT")); i >= 0 {
			b = b[i:]
		}
		c.t.Fatalf("%s did not exit within %v; its goroutines:\n%s", name, untilExit(), b)
	}
}

func (c *cluster) startAggregators() {
	for _, a := range c.aggs {
		c.start(a, "aggregator", "--config", a+".yaml")
	}
	c.waitLeader()
}

// waitLeader waits until some aggregator reports itself leader.
func (c *cluster) waitLeader() {
	waitFor(c.t, "a leader", untilElected(), func() bool {
		for _, a := range c.aggs {
			if done, started := c.exits[a]; started {
				select {
				case <-done:
					c.t.Fatalf("aggregator %s exited while the cluster was starting", a)
				default:
				}
			}
			out, _, err := c.cli(a, "--json", "aggregator", "status")
			if err == nil && strings.Contains(out, `"State": "leader"`) {
				return true
			}
		}
		return false
	})
}

func (c *cluster) startWorker(name string) { c.start(name, "worker", "--config", name+".yaml") }

func (c *cluster) kill(name string, sig syscall.Signal) {
	if p := c.procs[name]; p != nil && p.Process != nil {
		p.Process.Signal(sig)
	}
}

func (c *cluster) stopAll() {
	failed := c.t.Failed()
	if failed {
		// A failed test asks every process still running for its
		// goroutines' stacks first (SIGQUIT): what a stuck process was
		// waiting on is in its log, below.
		for name := range c.procs {
			select {
			case <-c.exits[name]:
			default:
				c.kill(name, syscall.SIGQUIT)
				select {
				case <-c.exits[name]:
				case <-time.After(5 * time.Second):
				}
			}
		}
	}
	for name := range c.procs {
		c.kill(name, syscall.SIGKILL)
	}
	if failed {
		for name := range c.procs {
			b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
			if dir := os.Getenv("SCELLIS_TEST_LOGS"); dir != "" {
				// Whole logs kept for a developer chasing a failure.
				os.MkdirAll(dir, 0o755)
				os.WriteFile(filepath.Join(dir, filepath.Base(c.dir)+"-"+name+".log"), b, 0o644)
			}
			var stacks []byte
			if i := bytes.Index(b, []byte("SIGQUIT: quit")); i >= 0 {
				b, stacks = b[:i], b[i:]
			}
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			c.t.Logf("--- %s.log (tail) ---\n%s%s", name, b, ourStacks(stacks, 4000))
		}
	}
}

// ourStacks condenses a Go goroutine dump to the goroutines running this
// module's code, each as its state line and this module's function names
// (innermost first), at most max bytes: what a stuck process was waiting
// on, without the runtime's own goroutines and frame addresses.
func ourStacks(dump []byte, max int) string {
	if len(dump) == 0 {
		return ""
	}
	const mod = "github.com/scellis/scellis/"
	var out strings.Builder
	out.WriteString("--- its goroutines in scellis code (SIGQUIT) ---\n")
	for _, block := range strings.Split(string(dump), "\n\n") {
		if !strings.Contains(block, mod) {
			continue
		}
		lines := strings.Split(block, "\n")
		for len(lines) > 0 && !strings.HasPrefix(lines[0], "goroutine ") {
			lines = lines[1:]
		}
		if len(lines) == 0 {
			continue
		}
		var b strings.Builder
		head, _, _ := strings.Cut(lines[0], " gp=")
		state := ""
		if i := strings.LastIndex(lines[0], "["); i >= 0 {
			state = lines[0][i:]
		}
		fmt.Fprintf(&b, "%s %s", head, state)
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, mod) {
				b.WriteString(" " + withoutArgs(strings.TrimPrefix(l, mod)))
			}
		}
		b.WriteString("\n")
		if out.Len()+b.Len() > max {
			out.WriteString("…\n")
			break
		}
		out.WriteString(b.String())
	}
	return out.String()
}

// withoutArgs cuts a stack line's trailing argument list:
// "pool.(*Worker).Run(0xc0, {0x1, 0x2})" is "pool.(*Worker).Run".
func withoutArgs(frame string) string {
	if !strings.HasSuffix(frame, ")") {
		return frame
	}
	depth := 0
	for i := len(frame) - 1; i >= 0; i-- {
		switch frame[i] {
		case ')':
			depth++
		case '(':
			if depth--; depth == 0 {
				return frame[:i]
			}
		}
	}
	return frame
}

// cli runs a client command as the member `as`.
func (c *cluster) cli(as string, args ...string) (string, string, error) {
	// Bounded, so a client retrying against a dead cluster cannot outlive the test.
	ctx, cancel := context.WithTimeout(context.Background(), untilCLI())
	defer cancel()
	cmd := c.cliCmd(ctx, as, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// cliCmd is the command cli runs, for a caller that runs it in the
// background (a watch).
func (c *cluster) cliCmd(ctx context.Context, as string, args ...string) *exec.Cmd {
	cmd := c.inNetns(as, exec.CommandContext(ctx, scellisBinary(c.t), args...))
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(c.dir, ".scellis"))
	cmd.Env = append(cmd.Env, "SCELLIS_IDENTITY="+filepath.Join(c.dir, as, "identity.key"), "SCELLIS_FEDERATION="+filepath.Join(c.dir, "federation.yaml"))
	return cmd
}

func (c *cluster) mustCLI(as string, args ...string) string {
	out, errs, err := c.cli(as, args...)
	if err != nil {
		c.t.Fatalf("scellis %v: %v\n%s%s", args, err, out, errs)
	}
	return out
}

type jobStatus struct {
	State string
	// SubmittedAt and DoneAt are by the leader's replicated clock (Unix ms).
	SubmittedAt int64 `json:"submitted_at"`
	DoneAt      int64 `json:"done_at"`
	Counts      struct{ Total, Verified, Unverified, Leased, Pending int }
	Shards      []struct {
		Index    int
		State    string
		Price    int64
		Agreeing []string
		Losers   []string
		Leases   []struct{ Peer string }
		// DecidedAt is when the shard was decided, by the leader's
		// replicated clock (Unix ms), as a run's started_at and done_at.
		DecidedAt int64 `json:"decided_at"`
	}
}

func (c *cluster) status(as, id string) jobStatus {
	var st jobStatus
	out := c.mustCLI(as, "--json", "job", "status", id)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		c.t.Fatalf("status: %v\n%s", err, out)
	}
	return st
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (budgets scaled ×%.2g for load, timing_test.go)", d, what, slack())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sweep50 writes a 50-shard train-eval sweep over generated hospital data.
func (c *cluster) sweep50() string {
	mustRun(c.t, scellisCmd(c.t, c.dir, "datagen", "hospitals", "--sites", "1", "--rows", "300", "--out", "data"))
	c.write("sweep.yaml", `name: sweep50
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5], l2: [0.0, 0.001, 0.01, 0.1, 1.0]}
reducer: {use: collect, params: {metric: auc, goal: max}}
params: {model: logistic, epochs: 1, batch_size: 32, test_frac: 0.3, seed: 5}
inputs:
  data: {path: data/hospital-1.csv, label: outcome, class: confidential}
`)
	return "sweep.yaml"
}

func TestPoolSweepMatchesSoloAndOutvotesLiar(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "consortium", 1, member{"w1", "worker"}, member{"w2", "worker"}, member{"liar", "worker"}, member{"alice", "researcher"})
	c.write("liar.yaml", "name: liar\nidentity: liar/identity.key\nfederation: federation.yaml\ncache_dir: liar/cache\npoll: 100ms\ncorrupt_results: true\n")
	job := c.sweep50()
	mustRun(t, scellisCmd(t, c.dir, "run", job, "--out", "solo"))
	c.startAggregators()
	for _, w := range []string{"w1", "w2", "liar"} {
		c.startWorker(w)
	}
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", job))
	waitFor(t, "the job to complete", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	c.mustCLI("alice", "job", "result", id, "--out", "pool")

	var solo, pool map[string]json.RawMessage
	readJSON(t, filepath.Join(c.dir, "solo", "result.json"), &solo)
	readJSON(t, filepath.Join(c.dir, "pool", "result.json"), &pool)
	for _, k := range []string{"format", "job", "content", "inputs", "shards", "work_units", "result"} {
		if !bytes.Equal(solo[k], pool[k]) {
			t.Errorf("pool result.json differs from the solo run in %q:\nsolo %s\npool %s", k, solo[k], pool[k])
		}
	}
	st := c.status("alice", id)
	if st.Counts.Verified != 50 {
		t.Fatalf("verified %d/50", st.Counts.Verified)
	}
	liarLost, liarWon := 0, 0
	var priced int64
	for _, s := range st.Shards {
		for _, p := range s.Agreeing {
			if p == "liar" {
				liarWon++
			}
		}
		for _, p := range s.Losers {
			if p == "liar" {
				liarLost++
			}
		}
		priced += s.Price * int64(len(s.Agreeing))
	}
	if liarWon != 0 || liarLost == 0 {
		t.Fatalf("the corrupting worker won %d shards and lost %d; want 0 and >0", liarWon, liarLost)
	}
	out := c.mustCLI("alice", "receipts", "verify")
	if !strings.Contains(out, "intact: 50 receipts") {
		t.Fatalf("receipts verify: %s", out)
	}
	var contrib map[string]int64
	if err := json.Unmarshal([]byte(c.mustCLI("alice", "--json", "receipts", "contributions")), &contrib); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, v := range contrib {
		sum += v
	}
	if sum != priced || contrib["liar"] != 0 {
		t.Fatalf("contributions %v sum to %d, planner prices × agreeing peers = %d", contrib, sum, priced)
	}
}

func TestPoolWorkerKilledMidShardIsReplaced(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "own", 1, member{"victim", "worker"}, member{"w1", "worker"}, member{"alice", "researcher"})
	// Shards that take a moment, so the victim is killed while holding one.
	c.write("slow.star", "def run(params, inputs):\n    n = 0\n    for i in range(params[\"n\"]):\n        n += i % 7\n    return {\"n\": n}\n")
	c.write("slow.yaml", "name: slow\nprogram: ./slow.star\npartitioner: {use: items, params: {items: [{n: 3000000}, {n: 3000001}, {n: 3000002}, {n: 3000003}]}}\nreducer: concat\nlimits: {steps: 100000000}\n")
	c.startAggregators()
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", "slow.yaml"))
	c.startWorker("victim")
	waitFor(t, "the victim to hold a lease", untilNoticed(), func() bool {
		for _, s := range c.status("alice", id).Shards {
			for _, l := range s.Leases {
				if l.Peer == "victim" {
					return true
				}
			}
		}
		return false
	})
	c.kill("victim", syscall.SIGKILL)
	c.startWorker("w1")
	waitFor(t, "the job to complete without the victim", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	for _, s := range c.status("alice", id).Shards {
		if len(s.Agreeing) != 1 || s.Agreeing[0] != "w1" {
			t.Fatalf("shard %d verified by %v, want w1", s.Index, s.Agreeing)
		}
	}
}

func TestPoolRefusesUnknownKey(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "own", 1, member{"alice", "researcher"})
	c.startAggregators()
	c.mustCLI("alice", "job", "ls") // the pool is up for members
	// A job nobody can finish (no workers here) can be cancelled.
	stuck := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("stuck", 2)))
	if out := c.mustCLI("alice", "job", "cancel", stuck, "--reason", "no workers"); !strings.Contains(out, "cancelled; 2 open shard(s) flagged") {
		t.Fatalf("job cancel: %s", out)
	}
	if st := c.status("alice", stuck); st.State != "cancelled" || st.Counts.Unverified != 2 {
		t.Fatalf("after cancel: %+v", st)
	}
	// An outsider writes itself into its own copy of the federation file:
	// the aggregator's file does not list it, so the handshake fails.
	pub := c.keygen("mallory")
	fed, _ := os.ReadFile(filepath.Join(c.dir, "federation.yaml"))
	c.write("mallory-fed.yaml", string(fed)+fmt.Sprintf("  - name: mallory\n    role: worker\n    public_key: %s\n", pub))
	ctx, cancel := context.WithTimeout(context.Background(), untilQuorum())
	defer cancel()
	cmd := exec.CommandContext(ctx, scellisBinary(t), "job", "ls", "--identity", "mallory/identity.key", "--federation", "mallory-fed.yaml")
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("an unknown key was served: %s", out)
	}
	if !strings.Contains(string(out), "certificate") && !strings.Contains(string(out), "tls") {
		t.Fatalf("refusal does not mention the TLS handshake: %s", out)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
