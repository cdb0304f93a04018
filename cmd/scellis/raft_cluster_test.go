package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	wal "github.com/hashicorp/raft-wal"
)

// nodeStatus is one line of `scellis --json aggregator status`.
type nodeStatus struct {
	Node string
	Raft struct {
		State                                              string
		Term, CommitIndex, AppliedIndex, LastSnapshotIndex uint64
		Leader                                             struct{ ID string }
		Servers                                            []struct{ ID string }
	}
	ChainSeq  uint64 `json:"chain_seq"`
	ChainHead string `json:"chain_head"`
	StateHash string `json:"state_hash"`
	Jobs      int    `json:"jobs"`
	CaughtUp  bool   `json:"caught_up"`
	// PlansRunning: submitted content planning or reducing in a child.
	PlansRunning int `json:"plans_running"`
	// Polling: the members the leader counts alive by their polls.
	Polling []string `json:"polling"`
	// DataPlane: the node's data-channel pairs, by peer.
	DataPlane *struct {
		Pairs []struct {
			Peer         string
			Path         string
			Candidates   string
			DirectBytes  int64 `json:"direct_bytes"`
			DirectConns  int64 `json:"direct_connections"`
			RelayedConns int64 `json:"relayed_connections"`
		}
	} `json:"data_plane"`
}

// statuses asks every reachable aggregator for its status, as member `as`.
func (c *cluster) statuses(as string) map[string]nodeStatus {
	out, _, err := c.cli(as, "--json", "aggregator", "status")
	if err != nil {
		return nil
	}
	var raw []nodeStatus
	if json.Unmarshal([]byte(out), &raw) != nil {
		return nil
	}
	m := map[string]nodeStatus{}
	for _, s := range raw {
		m[s.Node] = s
	}
	return m
}

func (c *cluster) leader(as string) string {
	for name, s := range c.statuses(as) {
		if s.Raft.State == "leader" {
			return name
		}
	}
	return ""
}

// polls reports whether the cluster's leader counts member alive by its
// polls (aggregator status, as member as).
func (c *cluster) polls(as, member string) bool {
	for _, s := range c.statuses(as) {
		if s.Raft.State == "leader" && slices.Contains(s.Polling, member) {
			return true
		}
	}
	return false
}

// converged waits until the named nodes report the same state hash and
// receipt-chain head, and returns that status.
func (c *cluster) converged(as string, nodes ...string) nodeStatus {
	var agreed nodeStatus
	var last map[string]nodeStatus
	done := false
	defer func() {
		if !done { // waitFor gave up: say where each node stood
			for _, n := range nodes {
				s := last[n]
				c.t.Logf("%s: raft %s term %d commit %d applied %d, chain %d %s, state %s", n, s.Raft.State, s.Raft.Term, s.Raft.CommitIndex, s.Raft.AppliedIndex, s.ChainSeq, s.ChainHead, s.StateHash)
			}
		}
	}()
	waitFor(c.t, fmt.Sprintf("%v to converge", nodes), untilRun(), func() bool {
		st := c.statuses(as)
		last = st
		for i, n := range nodes {
			s, ok := st[n]
			if !ok || s.StateHash == "" || (i > 0 && (s.StateHash != agreed.StateHash || s.ChainHead != agreed.ChainHead)) {
				return false
			}
			agreed = s
		}
		return true
	})
	done = true
	return agreed
}

func (c *cluster) restartAggregator(name string) {
	c.start(name, "aggregator", "--config", name+".yaml")
}

// montecarlo writes a Monte Carlo job of n quick shards.
func (c *cluster) montecarlo(name string, n int) string {
	c.write(name+".yaml", fmt.Sprintf("name: %s\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: {use: mean, params: {weight: samples}}\n", name, n*20000, n))
	return name + ".yaml"
}

// The leader dies mid-job: a new leader takes over, the job completes, and
// every node's receipt chain ends in the same head with no gap and no
// duplicate; the dead node, restarted from its disk, catches up. The job
// is submitted with --watch, as a user would: the watch follows it across
// the leader's death (it reconnects to another node) and ends with the
// summary, in tens of lines for 200 shards, not a line per event.
func TestClusterLeaderKilledMidJob(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"w2", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	c.startWorker("w1")
	c.startWorker("w2")
	type cliResult struct {
		out, errs string
		err       error
	}
	job := c.montecarlo("mc200", 200)
	watched := make(chan cliResult, 1)
	go func() {
		out, errs, err := c.cli("alice", "job", "submit", job, "--watch")
		watched <- cliResult{out, errs, err}
	}()
	// The submit prints the ID only when it exits; the pool names it sooner.
	var id string
	waitFor(t, "the job to be submitted", untilRun(), func() bool {
		out, _, err := c.cli("alice", "--json", "job", "ls")
		var jobs []struct{ ID, Name string }
		if err != nil || json.Unmarshal([]byte(out), &jobs) != nil {
			return false
		}
		for _, j := range jobs {
			if j.Name == "mc200" {
				id = j.ID
			}
		}
		return id != ""
	})
	waitFor(t, "a quarter of the shards", untilRun(), func() bool { return c.status("alice", id).Counts.Verified >= 50 })
	old := c.leader("alice")
	if old == "" {
		t.Fatal("no leader")
	}
	c.kill(old, syscall.SIGKILL)
	waitFor(t, "the job to complete under a new leader", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	var alive []string
	for _, a := range c.aggs {
		if a != old {
			alive = append(alive, a)
		}
	}
	if nl := c.leader("alice"); nl == "" || nl == old {
		t.Fatalf("leader after the kill: %q (old %s)", nl, old)
	}
	st := c.converged("alice", alive...)
	if st.ChainSeq != 200 {
		t.Fatalf("receipt chain has %d receipts for 200 verified shards", st.ChainSeq)
	}
	if out := c.mustCLI("alice", "receipts", "verify"); !strings.Contains(out, "intact: 200 receipts") {
		t.Fatalf("receipts verify: %s", out)
	}
	// The watch ends once the job is done (c.cli bounds it besides).
	w := <-watched
	t.Logf("job submit --watch (stderr):\n%s", w.errs)
	if w.err != nil || strings.TrimSpace(w.out) != id {
		t.Fatalf("job submit --watch: %v; stdout %q, want the job ID %s\n%s", w.err, w.out, id, w.errs)
	}
	lines := strings.Split(strings.TrimSpace(w.errs), "\n")
	summary := regexp.MustCompile(`^done in \S+: 200/200 shards decided \(200 verified, 0 unverified\), [0-9.]+ shards/s mean(; leases: [^;]+)?$`)
	if last := lines[len(lines)-1]; !summary.MatchString(last) {
		t.Errorf("the watch's last line is %q, want the summary", last)
	}
	if !strings.Contains(w.errs, "\njob complete: result ") || strings.Contains(w.errs, " leased to ") {
		t.Errorf("the watch lacks the job's completion, or lists leases one by one:\n%s", w.errs)
	}
	if len(lines) > 40 {
		t.Errorf("the watch wrote %d lines for 200 shards, want tens at most", len(lines))
	}
	c.restartAggregator(old)
	again := c.converged("alice", c.aggs...)
	if again.ChainHead != st.ChainHead {
		t.Fatalf("restarted node diverged: %s vs %s", again.ChainHead, st.ChainHead)
	}
}

// A stopped minority does not stop the majority; a lone node cannot
// commit; and all three nodes restarted from disk come back with the same
// state hash.
func TestClusterMinorityAndRestart(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	c.startWorker("w1")
	c.kill("agg-3", syscall.SIGKILL)
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-majority", 20)))
	waitFor(t, "the majority to finish a job", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	before := c.converged("alice", "agg-1", "agg-2")

	c.kill("agg-2", syscall.SIGKILL)
	c.waitExit("agg-2")
	// agg-1 alone: it must not lead, so it cannot commit. Its commit index
	// is read once agg-2 is gone: entries the pair committed after the
	// job (the second reducer's check) may reach agg-1 until then.
	alone := c.statuses("alice")["agg-1"].Raft.CommitIndex
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if st := c.statuses("alice")["agg-1"]; st.Raft.State == "leader" && st.Raft.CommitIndex > alone {
			t.Fatalf("a lone node committed: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := c.statuses("alice")["agg-1"]; st.Raft.State == "leader" {
		t.Fatalf("a lone node is still leader after its lease ran out: %+v", st)
	}
	c.restartAggregator("agg-2")
	c.restartAggregator("agg-3")
	all := c.converged("alice", c.aggs...)
	if all.ChainHead != before.ChainHead {
		t.Fatalf("chain head changed without new work: %s vs %s", all.ChainHead, before.ChainHead)
	}
	// Every node stopped, every node restarted from disk: same state.
	c.kill("w1", syscall.SIGKILL)
	all = c.converged("alice", c.aggs...)
	for _, a := range c.aggs {
		c.kill(a, syscall.SIGTERM)
	}
	for _, a := range c.aggs {
		c.waitExit(a) // graceful shutdowns release their ports
	}
	for _, a := range c.aggs {
		c.restartAggregator(a)
	}
	c.waitLeader()
	// converged already requires all three to report one state hash; the
	// replayed state must hold the same receipt chain as before the stop.
	// (The new leader may apply a clock tick, so the hash itself can move.)
	after := c.converged("alice", c.aggs...)
	if after.ChainHead != all.ChainHead || after.ChainSeq != all.ChainSeq || after.Raft.AppliedIndex < all.Raft.AppliedIndex {
		t.Fatalf("after a full restart\n%+v\nbefore\n%+v", after, all)
	}
}

// A follower whose disk is wiped is restored from the leader's snapshot and
// matches the others.
func TestClusterFollowerRestoredFromSnapshot(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"alice", "researcher"})
	for _, a := range c.aggs {
		b, _ := os.ReadFile(filepath.Join(c.dir, a+".yaml"))
		c.write(a+".yaml", string(b)+"snapshot_threshold: 16\nsnapshot_interval: 200ms\ntrailing_logs: 4\nsegment_bytes: 4096\n")
	}
	c.startAggregators()
	c.startWorker("w1")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-snap", 60)))
	waitFor(t, "the job", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	victim := "agg-3"
	if c.leader("alice") == victim {
		victim = "agg-2"
	}
	c.kill(victim, syscall.SIGKILL)
	// More work while it is away, so the log moves past what it had.
	id2 := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-snap-2", 60)))
	waitFor(t, "the second job", untilRun(), func() bool { return c.status("alice", id2).State == "done" })
	c.waitExit(victim)
	if err := os.RemoveAll(filepath.Join(c.dir, victim, "data", "raft")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, victim+".yaml"))
	c.write(victim+".yaml", string(b)+"join: true\n")
	c.restartAggregator(victim)
	st := c.converged("alice", c.aggs...)
	if got := c.statuses("alice")[victim]; got.Raft.LastSnapshotIndex == 0 {
		t.Fatalf("the wiped follower caught up without a snapshot: %+v", got)
	}
	if st.ChainSeq != 120 {
		t.Fatalf("chain has %d receipts, want 120", st.ChainSeq)
	}
}

// A node that restarts reads only once it has caught up. A follower
// killed while jobs were submitted hears the leader's heartbeat at once
// when it starts again, before it has the entries committed without it:
// it answered `job ls` with none of them, then some, for about half a
// second (and `fl launch --warm-start RUN` said SC9302 for a run `fl ls`
// listed). Asked alone (a federation file that lists only it), its first
// answer now holds every job, and its status says it caught up.
func TestClusterRestartedNodeReadsOnlyCaughtUp(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	c.startWorker("w1")
	fed, err := os.ReadFile(filepath.Join(c.dir, "federation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 2; round++ {
		victim := "agg-3"
		if c.leader("alice") == victim {
			victim = "agg-2"
		}
		// The federation file as a client that knows only the victim.
		parts := strings.Split(string(fed), "\n  - name: ")
		kept := parts[:1]
		for _, m := range parts[1:] {
			if !strings.HasPrefix(m, "agg-") || strings.HasPrefix(m, victim+"\n") {
				kept = append(kept, m)
			}
		}
		only := strings.Join(kept, "\n  - name: ")
		c.write("only.yaml", only)
		c.kill(victim, syscall.SIGKILL)
		c.waitExit(victim)
		var last string
		for k := range 4 {
			last = strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo(fmt.Sprintf("mc-%d-%d", round, k), 5)))
		}
		waitFor(t, "the jobs submitted without "+victim, untilRun(), func() bool { return c.status("alice", last).State == "done" })
		c.restartAggregator(victim)
		out, errs, err := c.cli("alice", "--json", "job", "ls", "--federation", "only.yaml")
		var jobs []struct{ Name string }
		if err != nil || json.Unmarshal([]byte(out), &jobs) != nil {
			t.Fatalf("job ls from %s alone: %v\n%s%s", victim, err, out, errs)
		}
		if len(jobs) != 4*round {
			t.Fatalf("the restarted %s answered job ls with %d jobs of %d:\n%s", victim, len(jobs), 4*round, out)
		}
		// Its status says so (read again until it does: a heartbeat
		// late past the stale bound on a loaded machine makes it catch
		// up again).
		waitFor(t, victim+"'s status to say it caught up", untilElected(), func() bool { return c.statuses("alice")[victim].CaughtUp })
	}
}

// A node whose key is not in the federation file cannot join or vote.
func TestClusterRefusesUnknownNode(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"alice", "researcher"})
	// agg-3 stays down; an impostor with its own key takes agg-3's
	// addresses, in a federation file of its own that lists its key.
	c.start("agg-1", "aggregator", "--config", "agg-1.yaml")
	c.start("agg-2", "aggregator", "--config", "agg-2.yaml")
	c.waitLeader()
	pub := c.keygen("impostor")
	fed, _ := os.ReadFile(filepath.Join(c.dir, "federation.yaml"))
	lines := strings.Split(string(fed), "\n")
	for i, l := range lines {
		if strings.Contains(l, "name: agg-3") {
			lines[i+2] = "    public_key: " + pub
		}
	}
	c.write("impostor-fed.yaml", strings.Join(lines, "\n"))
	c.write("impostor.yaml", "name: agg-3\nidentity: impostor/identity.key\nfederation: impostor-fed.yaml\ndata_dir: impostor/data\nlog_level: error\n")
	c.start("impostor", "aggregator", "--config", "impostor.yaml")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-impostor", 4)))
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if c.leader("alice") == "agg-3" {
			t.Fatal("the impostor became leader")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The impostor never receives the log: the real nodes refuse its TLS.
	// Ask it directly (it trusts alice's key, copied into its own file).
	real := c.converged("alice", "agg-1", "agg-2")
	if real.Raft.CommitIndex == 0 || c.status("alice", id).State == "" {
		t.Fatalf("the real cluster committed nothing: %+v", real)
	}
	out, errs, err := c.cli("alice", "--json", "aggregator", "status", "--federation", "impostor-fed.yaml")
	if err != nil {
		t.Fatalf("asking the impostor: %v\n%s%s", err, out, errs)
	}
	var seen []nodeStatus
	if err := json.Unmarshal([]byte(out), &seen); err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var imp *nodeStatus
	for i := range seen {
		if seen[i].Node == "agg-3" {
			imp = &seen[i]
		}
	}
	if imp == nil {
		t.Fatalf("the impostor did not answer:\n%s", out)
	}
	if imp.Raft.State == "leader" || imp.Raft.AppliedIndex >= real.Raft.CommitIndex || imp.Jobs != 0 {
		t.Fatalf("the impostor received the cluster's log or leads: %+v (real: %+v)", *imp, real)
	}

}

// `scellis aggregator leave` and `join` change the voters.
func TestClusterLeaveAndJoin(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"alice", "researcher"})
	c.startAggregators()
	voters := func() int { return len(c.statuses("alice")[c.leader("alice")].Raft.Servers) }
	c.mustCLI("agg-1", "aggregator", "leave", "agg-3")
	waitFor(t, "two voters", untilElected(), func() bool { return voters() == 2 })
	if out, _, err := c.cli("alice", "aggregator", "leave", "agg-2"); err == nil {
		t.Fatalf("a worker changed the voters: %s", out)
	}
	c.mustCLI("agg-2", "aggregator", "join", "agg-3")
	waitFor(t, "three voters", untilElected(), func() bool { return voters() == 3 })
	c.converged("alice", c.aggs...)
}

// A follower whose log tail was truncated restarts and catches up. Raft
// truncates a follower's tail when a new leader overwrites entries the old
// one never committed; raft-wal v0.4.0 then sealed the active segment
// without writing its index block, so the node's next start failed on that
// segment and never came back (hashicorp/raft-wal#31, fixed in v0.4.1). The
// test stops a follower, truncates the tail of its log the way Raft does
// (DeleteRange over the last entries of the active segment), and restarts
// it: it must open its log, take the lost entries back from the leader and
// converge.
func TestClusterRestartAfterTailTruncation(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"alice", "researcher"})
	c.startAggregators()
	// Entries to truncate: a job submission (no worker runs it).
	c.mustCLI("alice", "job", "submit", c.montecarlo("mc-trunc", 4))
	before := c.converged("alice", c.aggs...)
	victim := "agg-3"
	if c.leader("alice") == victim {
		victim = "agg-2"
	}
	c.kill(victim, syscall.SIGTERM)
	c.waitExit(victim)

	walDir := filepath.Join(c.dir, victim, "data", "raft", "wal")
	w, err := wal.Open(walDir)
	if err != nil {
		t.Fatalf("open the stopped follower's log: %v", err)
	}
	last, err := w.LastIndex()
	if err != nil || last < 3 {
		t.Fatalf("follower log ends at %d (%v)", last, err)
	}
	if err := w.DeleteRange(last-1, last); err != nil {
		t.Fatalf("truncate the tail: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	c.restartAggregator(victim)
	waitFor(t, victim+" to serve again", untilElected(), func() bool {
		select {
		case <-c.exits[victim]:
			t.Fatalf("%s exited on restart after a tail truncation", victim)
		default:
		}
		_, ok := c.statuses("alice")[victim]
		return ok
	})
	after := c.converged("alice", c.aggs...)
	if after.ChainHead != before.ChainHead || after.Jobs != before.Jobs || after.Raft.AppliedIndex < before.Raft.AppliedIndex {
		t.Fatalf("after the restart\n%+v\nbefore\n%+v", after, before)
	}
}

// A leader stopped with SIGTERM hands leadership to a follower before it
// exits: the log says to whom, that node leads the next term, and the
// cluster goes on committing without the stopped node.
func TestClusterSIGTERMLeaderHandsOver(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	old := c.leader("alice")
	if old == "" {
		t.Fatal("no leader")
	}
	term := c.statuses("alice")[old].Raft.Term
	c.kill(old, syscall.SIGTERM)
	c.waitExit(old)
	log, _ := os.ReadFile(filepath.Join(c.dir, old+".log"))
	var to string
	for _, line := range strings.Split(string(log), "\n") {
		if _, after, ok := strings.Cut(line, "handed leadership to "); ok {
			to = strings.TrimSpace(after)
		}
	}
	if to == "" || to == old {
		t.Fatalf("%s stopped without handing over leadership:\n%s", old, log)
	}
	st := c.statuses("alice")[to]
	if st.Raft.State != "leader" || st.Raft.Term != term+1 {
		t.Fatalf("%s after the hand-over: %s in term %d (the old leader led term %d)", to, st.Raft.State, st.Raft.Term, term)
	}
	c.startWorker("w1")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-handover", 4)))
	waitFor(t, "a job under the new leader", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	// The 12 hex digits the CLI prints name the job.
	if out := c.mustCLI("alice", "job", "status", id[7:19]); !strings.Contains(out, "state done") || !strings.Contains(out, id) {
		t.Fatalf("job status by prefix:\n%s", out)
	}
}

// With no aggregator running, the commands a person types fail with SC7103
// naming every node, instead of retrying silently for minutes.
func TestCLIFailsWhenNoAggregatorAnswers(t *testing.T) {
	t.Parallel() // its own processes and directories
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c := newCluster(t, "consortium", 3, member{"alice", "researcher"})
	c.write("run.yaml", "name: nowhere\nstrategy: fedavg\nmodel: {kind: logistic, inputs: 9}\ndataset: patients\nrounds: 1\nprivacy: {clip: 1.0, sigma: 1.0}\nsecure_aggregation: true\nstandardize: local\n")
	cmds := [][]string{
		{"job", "ls"},
		{"job", "submit", c.montecarlo("mc-nowhere", 2)},
		{"fl", "launch", "run.yaml"},
		{"fl", "status", "0123456789ab"},
	}
	type result struct {
		args       []string
		errs       string
		err        error
		overallDur time.Duration
	}
	results := make(chan result, len(cmds))
	for _, args := range cmds {
		go func() {
			start := time.Now()
			_, errs, err := c.cli("alice", args...)
			results <- result{args, errs, err, time.Since(start)}
		}()
	}
	for range cmds {
		r := <-results
		var ee *exec.ExitError
		if !errors.As(r.err, &ee) || ee.ExitCode() != 2 || !strings.Contains(r.errs, "SC7103") || !strings.Contains(r.errs, "no aggregator answered") {
			t.Errorf("scellis %v with no aggregator running (%v):\n%s", r.args, r.err, r.errs)
		}
		t.Logf("scellis %v gave up after %v", r.args, r.overallDur.Round(100*time.Millisecond))
	}
}
