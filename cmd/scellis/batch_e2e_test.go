package main

import (
	"strings"
	"testing"
)

// Batching workers (worker.yaml batch) on a three-node cluster of real
// processes: a consortium job (two replicas, commit–reveal, signed
// reports) run by two workers that lease several shards at once and hand
// their commitments, reveals and (for the HTTPS one) result bytes in
// batches, the leader copying each batch's bytes to a second node in one
// request. The job completes with every shard verified by both workers,
// every node ends with the same receipt chain, and `receipts verify`
// checks the chain and every receipt's peer signatures. Lean: 16 quick
// shards, one job; the cost is a three-node start and the job (37 s
// alone at load average 19 on two cores, parallel with the other cluster
// tests) — three nodes because the leader's batched copy to a second node
// (durableAll) is what only a cluster exercises.
func TestClusterBatchedWorkers(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "consortium", 3, member{"w1", "worker"}, member{"w2", "worker"}, member{"alice", "researcher"})
	// w1 moves its blobs over HTTPS (batched uploads), w2 over the data
	// plane (its default); both batch commits and reports.
	c.write("w1.yaml", "name: w1\nidentity: w1/identity.key\nfederation: federation.yaml\ncache_dir: w1/cache\nparallel: 2\nbatch: 8\npoll: 100ms\nice_policy: https\n")
	c.write("w2.yaml", "name: w2\nidentity: w2/identity.key\nfederation: federation.yaml\ncache_dir: w2/cache\nparallel: 1\nbatch: 8\npoll: 100ms\n")
	c.startAggregators()
	c.startWorker("w1")
	c.startWorker("w2")
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("batched", 16)))
	waitFor(t, "the batched job to complete", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	st := c.status("alice", id)
	for _, s := range st.Shards {
		if s.State != "verified" || len(s.Agreeing) != 2 {
			t.Errorf("shard %d: %s, agreeing %v; want verified by w1 and w2", s.Index, s.State, s.Agreeing)
		}
	}
	if got := c.converged("alice", c.aggs...).ChainSeq; got != 16 {
		t.Fatalf("the receipt chains hold %d receipts for 16 verified shards", got)
	}
	out := c.mustCLI("alice", "receipts", "verify")
	if !strings.Contains(out, "intact: 16 receipts") || !strings.Contains(out, "every receipt is signed by the peers it credits") {
		t.Fatalf("receipts verify: %s", out)
	}
}
