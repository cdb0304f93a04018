package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// Batching workers (worker.yaml batch) on a three-node cluster of real
// processes: a consortium job (two replicas, commit–reveal, signed
// reports) run by two workers that lease several shards at once and hand
// their commitments, reveals and (for the HTTPS one) result bytes in
// batches, the leader copying each batch's bytes to a second node in one
// request. The job completes with every shard verified by both workers,
// every node ends with the same receipt chain, and `receipts verify`
// checks the chain and every receipt's peer signatures, those made once
// for a request of reports (a Merkle root, each receipt with its path)
// included; a batch path or signature changed in an export is refused
// (checkBatchReceiptSignatures). Lean: 16 quick
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
	checkBatchReceiptSignatures(t, c, "w1")
}

// checkBatchReceiptSignatures checks the batch form of receipt signatures
// (receipt/batch.go) offline with the real binary, on the pool's export:
//   - every receipt whose signature the pool got in a batch (a path) has
//     that path, then that signature, altered in a copy whose chain was
//     rebuilt (hashes and links recomputed, so only the signature check
//     can tell): SC7306;
//   - the export re-signed as one batch by peer's own key (all its
//     statements under one root, each receipt with its path) verifies;
//     one receipt's path swapped for another's, or cut by a step, or its
//     root signature presented without a path, is SC7306.
//
// The second part does not depend on how the pool happened to group the
// reports: the pool's own batches depend on timing.
func checkBatchReceiptSignatures(t *testing.T, c *cluster, peer string) {
	t.Helper()
	export := c.mustCLI("alice", "receipts", "export", "--format", "json")
	var rs []receipt.Receipt
	if err := json.Unmarshal([]byte(export), &rs); err != nil || len(rs) < 3 {
		t.Fatalf("receipt export (%d receipts): %v", len(rs), err)
	}
	write := func(name string, tamper func(rs []receipt.Receipt)) string {
		cp := make([]receipt.Receipt, len(rs))
		for i := range rs {
			cp[i] = rs[i].Clone()
		}
		tamper(cp)
		var ch receipt.Chain
		for _, r := range cp {
			if err := ch.Append(ch.Next(r)); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := json.Marshal(ch.All())
		c.write(name, string(b))
		return name
	}
	batched := 0
	for i, r := range rs {
		for k, s := range r.Signatures {
			if len(s.Path) == 0 {
				continue
			}
			batched++
			if batched > 2 {
				continue // two are enough to tamper with
			}
			c.refused("alice", "SC7306", []string{"does not verify"}, "receipts", "verify", "--file",
				write("receipts-path-edited.json", func(rs []receipt.Receipt) { rs[i].Signatures[k].Path[9] ^= 1 }))
			c.refused("alice", "SC7306", []string{"does not verify"}, "receipts", "verify", "--file",
				write("receipts-batch-forged.json", func(rs []receipt.Receipt) { rs[i].Signatures[k].Sig[9] ^= 1 }))
		}
	}
	t.Logf("%d of the pool's receipt signatures were made for a batch of reports", batched)

	id, _, err := identity.Load(filepath.Join(c.dir, peer, "identity.key"), identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type at struct{ r, s int }
	var mine []at
	var leaves [][32]byte
	for i, r := range rs {
		for k, s := range r.Signatures {
			if s.Peer == peer {
				mine = append(mine, at{i, k})
				leaves = append(leaves, receipt.StatementLeaf(receipt.Statement{Job: r.Job, Shard: r.ShardIndex, Result: s.Result, Tier: r.Tier, Peer: peer}))
			}
		}
	}
	if len(mine) < 3 {
		t.Fatalf("%s signed %d receipts, want at least 3", peer, len(mine))
	}
	root, paths := receipt.BatchTree(leaves)
	sig := identity.Sign(id, identity.PurposeResultBatch, root[:])
	resign := func(rs []receipt.Receipt) {
		for n, a := range mine {
			rs[a.r].Signatures[a.s].Sig, rs[a.r].Signatures[a.s].Path = bytes.Clone(sig), bytes.Clone(paths[n])
		}
	}
	c.mustCLI("alice", "receipts", "verify", "--file", write("receipts-one-batch.json", resign))
	a, b := mine[0], mine[1]
	for name, tamper := range map[string]func(rs []receipt.Receipt){
		"another's path": func(rs []receipt.Receipt) { rs[a.r].Signatures[a.s].Path = bytes.Clone(paths[1]) },
		"a path cut": func(rs []receipt.Receipt) {
			p := rs[b.r].Signatures[b.s].Path
			rs[b.r].Signatures[b.s].Path = p[:len(p)-receipt.PathStep]
		},
		"no path": func(rs []receipt.Receipt) { rs[a.r].Signatures[a.s].Path = nil },
	} {
		c.refused("alice", "SC7306", []string{"does not verify"}, "receipts", "verify", "--file",
			write("receipts-batch-"+strings.ReplaceAll(name, " ", "-")+".json", func(rs []receipt.Receipt) { resign(rs); tamper(rs) }))
	}
}
