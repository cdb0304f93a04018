package main

import (
	"encoding/hex"
	"encoding/json"
	"github.com/scellis/scellis/receipt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
)

// The convergent tier through real processes: honest workers produce
// bit-different results (tensor.fast_sum sums in an order that varies per
// call) that a verifier peer — the leader's reducer peer, running the
// program's compare function — accepts within the tolerance, and a
// cheater whose numbers are 0.1% off is out-voted and replaced. The same
// cluster runs a Freivalds-checked matrix product (the liar's blocks fail
// the check and are executed again) and the second reducer (the other
// aggregator) checks the convergent reduction. Lean: two aggregators, 3
// shards of 4 sums of 2000 draws, a 64×64 product in 2 blocks; statuses
// are polled in-process. Measured on two busy cores: about 6 s from the
// aggregators' start to the last assertion (three phases: the liar alone,
// then w1, then w2), plus the cluster's keygen; one cluster serves every
// assertion of items 1, 4 and 6 of the issue.
func TestPoolConvergentTier(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process pool test")
	}
	c := newCluster(t, "consortium", 2, member{"w1", "worker"}, member{"w2", "worker"}, member{"liar", "worker"}, member{"alice", "researcher"})
	c.write("liar.yaml", "name: liar\nidentity: liar/identity.key\nfederation: federation.yaml\ncache_dir: liar/cache\npoll: 100ms\ncorrupt_results: true\n")
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "convergent", "fastsum.star"))
	if err != nil {
		t.Fatal(err)
	}
	c.write("fastsum.star", string(src))
	// A reducer that is not bit-exact either, so that the second reducer
	// (the other aggregator) has a reduction to compare within tolerance.
	c.write("total.star", "def reduce(results, params):\n    sums = []\n    for r in results:\n        sums += r[\"value\"][\"sums\"]\n    return {\"total\": tensor.fast_sum(sums), \"sums\": sums}\n")
	c.write("fastsum.yaml", `name: fastsum
program: ./fastsum.star
partitioner: {use: range, params: {start: 0, count: 3, chunks: 3}}
reducer: ./total.star
params: {n: 2000, sums: 4}
verification:
  tier: convergent
  tolerance: {abs: 1e-9, rel: 1e-12, per: tensor}
`)
	c.write("matmul.yaml", `name: matmul-64
program: matmul
partitioner: {use: range, params: {start: 0, count: 64, chunks: 2}}
reducer: concat
params: {n: 64, seed: 3}
verification: {freivalds: 20}
`)
	c.startAggregators()
	// The Freivalds job first: leases go in submission order. The liar
	// alone runs every shard first, so each of its results is judged.
	mm := strings.TrimSpace(c.mustCLI("alice", "job", "submit", "matmul.yaml"))
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", "fastsum.yaml"))
	c.startWorker("liar")
	waitFor(t, "the liar's products to fail their checks", untilRun(), func() bool {
		for _, s := range c.fullStatus(mm).Shards {
			if len(s.Verdicts) == 0 || len(s.Verdicts[0].Agreeing) != 0 {
				return false
			}
		}
		return true
	})
	// w1 re-executes the products and is the second replica of every
	// convergent shard: each verdict there finds one agreeing peer of two.
	c.startWorker("w1")
	waitFor(t, "a verdict on every convergent shard", untilRun(), func() bool {
		for _, s := range c.fullStatus(id).Shards {
			if len(s.Verdicts) == 0 {
				return false
			}
		}
		return true
	})
	for _, s := range c.fullStatus(id).Shards {
		if s.State == coordinator.StateVerified || len(s.Verdicts[0].Agreeing) != 1 {
			t.Fatalf("shard %d with the liar and w1 only: %s, first verdict %+v", s.Index, s.State, s.Verdicts[0])
		}
	}
	// The third replica replaces the liar's result.
	c.startWorker("w2")
	waitFor(t, "the jobs to complete", untilRun(), func() bool {
		return c.fullStatus(id).State == "done" && c.fullStatus(mm).State == "done"
	})
	_, fed := c.memberKeys("alice")
	checkSigned := func(job string, s coordinator.ShardStatus) {
		t.Helper()
		// The verdict is signed by the verifier over the verdict without
		// its time.
		v := s.Verdicts[len(s.Verdicts)-1]
		sig, _ := hex.DecodeString(v.Sig)
		agg, _ := fed.Member(v.Verifier)
		signed := coordinator.ReportVerdict{Job: content.Ref(job), Shard: s.Index, Verifier: v.Verifier, Key: agg.PublicKey.String(), Judged: v.Judged, Agreeing: v.Agreeing, Canonical: v.Canonical, Detail: v.Detail}
		if !strings.HasPrefix(v.Verifier, "agg-") || !identity.Verify(agg.PublicKey, identity.PurposeVerdict, coordinator.VerdictBytes(signed), sig) {
			t.Fatalf("%s shard %d: verdict by %q does not verify against its key", job, s.Index, v.Verifier)
		}
	}
	st := c.fullStatus(id)
	bitDifferent := 0
	for _, s := range st.Shards {
		if s.State != coordinator.StateVerified || !slices.Equal(s.Agreeing, []string{"w1", "w2"}) || !slices.Equal(s.Losers, []string{"liar"}) {
			t.Fatalf("shard %d: %s agreeing %v losers %v; want verified by w1, w2 over the liar", s.Index, s.State, s.Agreeing, s.Losers)
		}
		hashes := map[string]content.Ref{}
		for _, r := range s.Reports {
			hashes[r.Peer] = r.Result
		}
		if hashes["w1"] != hashes["w2"] {
			bitDifferent++
		}
		checkSigned(id, s)
	}
	if bitDifferent == 0 {
		t.Fatal("w1 and w2 reported byte-identical results on every shard: the convergent tier was not exercised")
	}
	for _, s := range c.fullStatus(mm).Shards {
		if s.State != coordinator.StateVerified || !slices.Equal(s.Losers, []string{"liar"}) || len(s.Agreeing) != 1 || s.Method != "" && s.Method != "freivalds-k20" {
			t.Fatalf("product shard %d: %s agreeing %v losers %v", s.Index, s.State, s.Agreeing, s.Losers)
		}
		checkSigned(mm, s)
	}
	// The reduction is verified too: the other aggregator reduced the
	// same accepted results and found its reduction within tolerance.
	waitFor(t, "the second reducer's check", untilRun(), func() bool { return len(c.fullStatus(id).ReductionChecks) > 0 })
	st = c.fullStatus(id)
	if rc := st.ReductionChecks[0]; !rc.Agrees || rc.Peer == st.Reducer || !strings.HasPrefix(rc.Peer, "agg-") {
		t.Fatalf("reduction by %s checked %+v", st.Reducer, rc)
	} else {
		t.Logf("second reduction by %s: %s, first %s (bit-identical: %v)", rc.Peer, rc.Reduced.Short(), st.Reduced.Short(), rc.Reduced == st.Reduced)
	}
	c.mustCLI("alice", "job", "result", id, "--out", "pool")
	var doc struct {
		Verification struct{ Tier, Tolerance, Method string }
		Shards       []struct {
			Check *struct{ Tier, Tolerance, Method, Verifier string }
		}
	}
	readJSON(t, filepath.Join(c.dir, "pool", "result.json"), &doc)
	const tol = "abs=1e-09,rel=1e-12,per=tensor"
	if doc.Verification.Tier != "convergent" || doc.Verification.Tolerance != tol || doc.Verification.Method != "quorum-2-convergent("+tol+")" {
		t.Fatalf("result.json verification: %+v", doc.Verification)
	}
	for i, s := range doc.Shards {
		if s.Check == nil || s.Check.Tier != "convergent" || s.Check.Tolerance != tol || !strings.HasPrefix(s.Check.Verifier, "agg-") {
			t.Fatalf("result.json shard %d check: %+v", i, s.Check)
		}
	}
	c.mustCLI("alice", "job", "result", mm, "--out", "products")
	var pdoc struct {
		Verification struct {
			Method           string
			ErrorProbability float64 `json:"error_probability"`
		}
	}
	readJSON(t, filepath.Join(c.dir, "products", "result.json"), &pdoc)
	if pdoc.Verification.Method != "freivalds-k20" || pdoc.Verification.ErrorProbability != 1.0/(1<<20) {
		t.Fatalf("products result.json verification: %+v", pdoc.Verification)
	}
	if out := c.mustCLI("alice", "receipts", "verify"); !strings.Contains(out, "intact: 5 receipts") || !strings.Contains(out, "signed by the peers it credits") {
		t.Fatalf("receipts verify: %s", out)
	}
	checkReceiptSignatures(t, c)
}

// checkReceiptSignatures exports the pool's receipts and checks them
// offline with the federation file: the export verifies, and a copy whose
// chain was rebuilt (every hash and link recomputed, so only the peers'
// signatures can tell) with a forged or a dropped signature fails with
// SC7306.
func checkReceiptSignatures(t *testing.T, c *cluster) {
	t.Helper()
	export := c.mustCLI("alice", "receipts", "export", "--format", "json")
	var rs []receipt.Receipt
	if err := json.Unmarshal([]byte(export), &rs); err != nil || len(rs) == 0 {
		t.Fatalf("receipt export: %v\n%s", err, export)
	}
	for _, r := range rs {
		if r.Reverses == 0 && len(r.Signatures) != len(r.Peers) {
			t.Fatalf("receipt %d credits %v with signatures %+v", r.Seq, r.Peers, r.Signatures)
		}
	}
	write := func(name string, tamper func(*receipt.Receipt)) string {
		var ch receipt.Chain
		for i, r := range rs {
			r = r.Clone()
			if i == 0 {
				tamper(&r)
			}
			if err := ch.Append(ch.Next(r)); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := json.Marshal(ch.All())
		c.write(name, string(b))
		return name
	}
	c.mustCLI("alice", "receipts", "verify", "--file", write("receipts-ok.json", func(*receipt.Receipt) {}))
	c.refused("alice", "SC7306", []string{"does not verify"}, "receipts", "verify", "--file",
		write("receipts-forged.json", func(r *receipt.Receipt) { r.Signatures[0].Sig[5] ^= 1 }))
	c.refused("alice", "SC7306", []string{"no signature"}, "receipts", "verify", "--file",
		write("receipts-unsigned.json", func(r *receipt.Receipt) { r.Signatures, r.Tier = nil, "" }))
}
