package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// A sub-job is admitted only under its delegation's ID, with one parent
// shard per shard in increasing order; a child's report carries a
// citation of its chain head, checked with the report's key, and the
// receipt keeps it (two replicas, state hashes compared after every
// command).
func TestSubJobsAndCitations(t *testing.T) {
	r := &rig{t: t, now: 10}
	for range 2 {
		m, err := New(Config{Regime: trust.Own, DefaultLeaseTTL: 1000, CommitReveal: true, SignedReports: true})
		if err != nil {
			t.Fatal(err)
		}
		r.ms = append(r.ms, m)
	}
	// The child's side: a sub-job of parent shards 3 and 7.
	del := Delegation{Delegate: "eu", Job: content.Hash([]byte("parent")), Shards: []int{3, 7}}
	sub := SubmitJob{Job: SubJobID(del), Name: "sub", Bundle: content.Hash([]byte("b")), Delegated: &del, Now: r.now,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("s3")), Price: 1, PriceBasis: "flat"}, {Index: 1, ID: content.Hash([]byte("s7")), Price: 1, PriceBasis: "flat"}}}
	wrongID := sub
	wrongID.Job = content.Hash([]byte("other"))
	wantCode(t, r.apply(wrongID), diag.PoolBadJob)
	unordered := sub
	unordered.Delegated = &Delegation{Delegate: "eu", Job: del.Job, Shards: []int{7, 3}}
	unordered.Job = SubJobID(*unordered.Delegated)
	wantCode(t, r.apply(unordered), diag.PoolBadJob)
	// Deeper in a tree the delegation also maps each shard to the root
	// job's: one root shard per shard, distinct, with a root job named.
	for _, bad := range []Delegation{
		{Delegate: "eu", Job: del.Job, Shards: del.Shards, Root: content.Hash([]byte("root")), RootShards: []int{12}},
		{Delegate: "eu", Job: del.Job, Shards: del.Shards, Root: content.Hash([]byte("root")), RootShards: []int{12, 12}},
		{Delegate: "eu", Job: del.Job, Shards: del.Shards, RootShards: []int{12, 13}},
	} {
		deep := sub
		deep.Delegated = &bad
		deep.Job = SubJobID(bad)
		wantCode(t, r.apply(deep), diag.PoolBadJob)
	}
	if root, shards := (Delegation{Job: del.Job, Shards: del.Shards, Root: content.Hash([]byte("root")), RootShards: []int{12, 40}}).Plan(); root != content.Hash([]byte("root")) || shards[1] != 40 {
		t.Errorf("Plan of a deep delegation: %s %v", root.Short(), shards)
	}
	if res := r.apply(sub); res.Refused() {
		t.Fatal(res.Refusal)
	}
	if st, _ := r.ms[1].Job(sub.Job); st.Delegated == nil || st.Delegated.Shards[1] != 7 {
		t.Fatalf("the sub-job's status lost its delegation: %+v", st.Delegated)
	}

	// The parent's side: the child reports shard 0 with a citation.
	eu, other := identity.NewFromSeed([32]byte{1}), identity.NewFromSeed([32]byte{2})
	job := content.Hash([]byte("parent job"))
	if res := r.apply(SubmitJob{Job: job, Name: "p", Bundle: content.Hash([]byte("b")), Now: r.now,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("p0")), Price: 2, PriceBasis: "flat"}}}); res.Refused() {
		t.Fatal(res.Refusal)
	}
	r.job = job
	r.lease("eu")
	res := result("0.5")
	cite := func(signer *identity.Identity, peer string) *receipt.Citation {
		c := &receipt.Citation{Peer: peer, Seq: 4, Head: content.Hash([]byte("child head"))}
		c.Sig = identity.Sign(signer, identity.PurposeCite, receipt.CitationBytes(c.Peer, c.Seq, c.Head))
		return c
	}
	report := func(c *receipt.Citation) ReportResult {
		st := StatementOf(job, 0, res, Policy{}, "eu")
		return ReportResult{Peer: "eu", Job: job, Shard: 0, Result: res, Key: eu.Public().String(), Sig: identity.Sign(eu, identity.PurposeResult, st.Bytes()), Cite: c, Now: r.now}
	}
	wantCode(t, r.apply(report(cite(other, "eu"))), diag.VerifyBadSignature) // not the reporter's key
	wantCode(t, r.apply(report(cite(eu, "us"))), diag.VerifyBadSignature)    // another child's chain
	if got := r.apply(report(cite(eu, "eu"))); got.Refused() {
		t.Fatal(got.Refusal)
	}
	rs := r.ms[1].Receipts(0)
	last := rs[len(rs)-1]
	if len(last.Cites) != 1 || last.Cites[0].Seq != 4 || last.Cites[0].Peer != "eu" {
		t.Fatalf("the receipt does not keep the citation: %+v", last.Cites)
	}
	if err := last.VerifyCites(); err != nil {
		t.Fatal(err)
	}
	if err := receipt.Verify(rs); err != nil {
		t.Fatal(err)
	}
	last.Cites[0].Seq = 5
	last.Hash = last.ComputeHash()
	if err := last.VerifyCites(); err == nil {
		t.Fatal("a citation edited after signing verifies")
	}
}
