package consensus

import (
	"context"
	"sync"
	"testing"
	"time"
)

// AppliedThrough tells what Raft handed to the state machine from what the
// machine applied: with the machine held on a command, the command's entry
// is committed and handed over (AppliedIndex reaches it) but not applied;
// released, it is. A follower restarted from its disk counts the entries
// of its snapshot as applied.
func TestAppliedThrough(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, func(cfg *Config) { cfg.SnapshotThreshold = 8; cfg.TrailingLogs = 4 })
	leader := c.waitLeader()
	n := c.nodes[leader]
	var ref chain
	c.applyN(leader, "before", 20, &ref)
	if !n.AppliedThrough(n.raft.AppliedIndex()) {
		t.Fatal("the leader has not applied what it answered")
	}
	g := c.sms[leader].holdNext()
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(g.release) }) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := n.Apply(ctx, []byte("held"))
		done <- err
	}()
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the command never reached the state machine")
	}
	held := n.raft.AppliedIndex()
	if n.AppliedThrough(held) {
		t.Fatalf("entry %d counts as applied while the machine is still applying it", held)
	}
	if !n.AppliedThrough(held - 1) {
		t.Fatalf("entry %d, before the held one, does not count as applied", held-1)
	}
	release.Do(func() { close(g.release) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !n.AppliedThrough(held) {
		t.Fatalf("entry %d does not count as applied once the machine applied it", held)
	}
	ref.add([]byte("held"))

	// A follower restarted from its disk: its snapshot's entries are in
	// its state; what followed is replayed once the leader says it is
	// committed.
	var follower string
	for id := range c.nodes {
		if id != leader {
			follower = id
			break
		}
	}
	if err := c.nodes[follower].Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.stop(follower)
	f := c.restart(follower)
	c.waitConverged([]string{follower}, ref)
	waitFor(t, 10*time.Second, func() bool { return f.AppliedThrough(held) }, "the restarted follower to count entry %d as applied", held)
}
