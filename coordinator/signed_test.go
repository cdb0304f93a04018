package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Signed reports and verdicts on two replicas (state hashes compared after
// every command): an unsigned report, one signed by another key, for
// another result or another tier, and an unsigned or forged verdict are
// refused with SC7305; the accepted convergent shard's receipt carries
// both peers' signatures of their own (different) results, which verify
// offline; once the membership is in the log, a key it does not list is
// refused.
func TestSignedReportsAndVerdicts(t *testing.T) {
	if PurposeVerdict != string(identity.PurposeVerdict) {
		t.Fatal("PurposeVerdict drifted from identity's")
	}
	r := &rig{t: t, now: 10}
	for range 2 {
		m, err := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 1000, CommitReveal: true, SignedReports: true})
		if err != nil {
			t.Fatal(err)
		}
		r.ms = append(r.ms, m)
	}
	ids := map[string]*identity.Identity{}
	for i, p := range []string{"w1", "w2", "agg", "mallory"} {
		ids[p] = identity.NewFromSeed([32]byte{byte(i + 7)})
	}
	key := func(p string) string { return ids[p].Public().String() }
	pol := Policy{Replicas: 2, Check: CheckCompare, Tolerance: "abs=0.1"}
	job := content.Hash([]byte("signed"))
	sub := SubmitJob{Job: job, Name: "signed", Bundle: content.Hash([]byte("b")), Policy: pol, Submitter: "alice", Now: r.now,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("s0")), Price: 3, PriceBasis: "flat"}, {Index: 1, ID: content.Hash([]byte("s1")), Price: 3, PriceBasis: "flat"}}}
	if res := r.apply(sub); res.Refused() {
		t.Fatal(res.Refusal)
	}
	r.job = job
	res1, res2 := result("1.00"), result("1.01")
	r.lease("w1")
	r.lease("w2")
	r.commit("w1", 0, res1)
	r.commit("w2", 0, res2)
	report := func(peer, signer string, res content.Ref, tier string) ReportResult {
		n, _ := nonceOf(byte(len(peer)))
		st := receipt.Statement{Job: job, Shard: 0, Result: res, Tier: tier, Peer: peer}
		return ReportResult{Peer: peer, Job: job, Shard: 0, Result: res, Nonce: n, Key: key(peer), Sig: identity.Sign(ids[signer], identity.PurposeResult, st.Bytes()), Now: r.now}
	}
	unsigned := report("w1", "w1", res1, receipt.TierConvergent)
	unsigned.Sig = nil
	wantCode(t, r.apply(unsigned), diag.VerifyBadSignature)
	wantCode(t, r.apply(report("w1", "mallory", res1, receipt.TierConvergent)), diag.VerifyBadSignature) // w1's key, signed by another
	if res := r.apply(report("w1", "w1", res2, receipt.TierConvergent)); !res.Refused() {
		t.Fatal("w1 revealed another result than it committed to") // the commitment refuses it first
	}
	wrongTier := report("w1", "w1", res1, receipt.TierReplayable)
	wantCode(t, r.apply(wrongTier), diag.VerifyBadSignature)
	if res := r.apply(report("w1", "w1", res1, receipt.TierConvergent)); res.Refused() {
		t.Fatal(res.Refusal)
	}
	if res := r.apply(report("w2", "w2", res2, receipt.TierConvergent)); res.Refused() {
		t.Fatal(res.Refusal)
	}
	// A producer may not judge its own result.
	self := ReportVerdict{Job: job, Shard: 0, Verifier: "w1", Key: key("w1"), Judged: 2, Agreeing: []string{"w1", "w2"}, Canonical: res1}
	self.Sig = identity.Sign(ids["w1"], identity.PurposeVerdict, VerdictBytes(self))
	wantCode(t, r.apply(self), diag.VerifyBadVerdict)
	// The verdict: unsigned, forged, then signed by the verifier.
	v := ReportVerdict{Job: job, Shard: 0, Verifier: "agg", Key: key("agg"), Judged: 2, Agreeing: []string{"w1", "w2"}, Canonical: res1}
	wantCode(t, r.apply(v), diag.VerifyBadSignature)
	v.Sig = identity.Sign(ids["agg"], identity.PurposeVerdict, VerdictBytes(ReportVerdict{Job: job, Shard: 0, Verifier: "agg", Key: key("agg"), Judged: 2, Agreeing: []string{"w1"}, Canonical: res1}))
	wantCode(t, r.apply(v), diag.VerifyBadSignature)
	v.Sig = identity.Sign(ids["agg"], identity.PurposeVerdict, VerdictBytes(v))
	v.Now = r.now
	if res := r.apply(v); res.Refused() || res.Response.(*VerdictResponse).Outcome != OutcomeVerified {
		t.Fatalf("signed verdict: %+v", res)
	}
	rc := r.ms[0].Receipts(0)
	if len(rc) != 1 || rc[0].Tier != receipt.TierConvergent || len(rc[0].Signatures) != 2 || rc[0].Signatures[1].Result != res2 {
		t.Fatalf("receipt %+v", rc)
	}
	keyOf := func(p string) (string, bool) { id, ok := ids[p]; return id.Public().String(), ok }
	if err := rc[0].VerifySignatures(keyOf); err != nil {
		t.Fatalf("the minted receipt does not verify: %v", err)
	}

	// Once the membership is in the log, only its keys sign.
	base := []MemberEntry{{Name: "agg", Role: "aggregator", PublicKey: key("agg"), Address: "a:1", RaftAddress: "a:2"}, {Name: "ops", Role: "operator", PublicKey: "k-ops"},
		{Name: "w1", Role: "worker", PublicKey: key("mallory")}, {Name: "w2", Role: "worker", PublicKey: key("w2")}}
	if res := r.apply(ChangeMembership{Base: base, Seq: 0, Op: "add", Member: MemberEntry{Name: "w9", Role: "worker", PublicKey: "k-w9"}, Operator: "ops", Signed: []byte{1}, Now: r.now}); res.Refused() {
		t.Fatal(res.Refusal)
	}
	r.lease("w1")
	r.lease("w2")
	r.commit("w1", 1, res1)
	r.commit("w2", 1, res1)
	rep := report("w1", "w1", res1, receipt.TierConvergent)
	rep.Shard = 1
	wantCode(t, r.apply(rep), diag.VerifyBadSignature) // w1's key in the log is another
	rep.Key, rep.Sig = key("mallory"), identity.Sign(ids["mallory"], identity.PurposeResult, StatementOf(job, 1, res1, pol, "w1").Bytes())
	if res := r.apply(rep); res.Refused() {
		t.Fatalf("w1 signing with its key in the log: %v", res.Refusal)
	}
}

// A batch's reports have their signatures checked ahead on all cores
// (preverify): a batch with good and forged reports reaches exactly the
// verdicts, responses and state of the same reports applied one by one.
func TestBatchPreverifiedSignatures(t *testing.T) {
	const n = 40
	batched, single, job, pol := twoLeasedMachines(t, "preverify", n)
	w, mallory := identity.NewFromSeed([32]byte{1}), identity.NewFromSeed([32]byte{2})
	var reports []Command
	for i := range n {
		res := result(string(rune('a' + i)))
		st := StatementOf(job, i, res, pol, "w1")
		signer := w
		if i%5 == 3 {
			signer = mallory // forged: w1's key, another's signature
		}
		reports = append(reports, ReportResult{Peer: "w1", Job: job, Shard: i, Result: res, Key: w.Public().String(),
			Sig: identity.Sign(signer, identity.PurposeResult, st.Bytes()), Now: 3})
	}
	// The checks are made ahead, one verdict per report, forged ones false
	// (so the batch below is answered from them, not by apply's own checks).
	batched.preverify(Batch{Commands: reports})
	if len(batched.preverified) != n {
		t.Fatalf("%d signatures checked ahead, want %d", len(batched.preverified), n)
	}
	for i, c := range reports {
		r := c.(ReportResult)
		key := sigCheck{r.Key, receipt.PurposeResult, string(StatementOf(job, i, r.Result, pol, "w1").Bytes()), string(r.Sig)}
		if ok, done := batched.preverified[key]; !done || ok != (i%5 != 3) {
			t.Fatalf("report %d checked ahead: %v (made %v)", i, ok, done)
		}
	}
	batched.preverified = nil
	applyBatchAndSingly(t, batched, single, reports, func(i int) bool { return i%5 == 3 })
	if batched.preverified != nil {
		t.Fatal("the batch's checks outlived it")
	}
}

// Reports signed as one batch (one signature of the Merkle root of their
// statements, each report with its path; receipt/batch.go) are accepted
// with their signature checked once, and each receipt keeps the shared
// signature and its own path and verifies offline on its own; a batch
// report whose path leads from another statement, or that lies about its
// result, is refused (SC7305) like a forged single signature. The batch
// reaches the same state applied whole as one by one.
func TestBatchSignedReports(t *testing.T) {
	const n = 12
	batched, single, job, pol := twoLeasedMachines(t, "batch-signed", n)
	w := identity.NewFromSeed([32]byte{1})
	leaves := make([][32]byte, n)
	results := make([]content.Ref, n)
	for i := range n {
		results[i] = result(string(rune('a' + i)))
		leaves[i] = receipt.StatementLeaf(StatementOf(job, i, results[i], pol, "w1"))
	}
	root, paths := receipt.BatchTree(leaves)
	sig := identity.Sign(w, identity.PurposeResultBatch, root[:])
	var reports []Command
	for i := range n {
		rep := ReportResult{Peer: "w1", Job: job, Shard: i, Result: results[i], Key: w.Public().String(), Sig: sig, Path: paths[i], Now: 3}
		switch i {
		case 4:
			rep.Path = paths[5] // another statement's path
		case 7:
			rep.Result = result("lie") // not the result the root covers
		}
		reports = append(reports, rep)
	}
	batched.preverify(Batch{Commands: reports})
	// One check for the ten good reports; the two bad ones lead to roots
	// of their own.
	if len(batched.preverified) != 3 {
		t.Fatalf("%d signatures checked ahead, want 3", len(batched.preverified))
	}
	batched.preverified = nil
	applyBatchAndSingly(t, batched, single, reports, func(i int) bool { return i == 4 || i == 7 })
	keyOf := func(p string) (string, bool) { return w.Public().String(), p == "w1" }
	rs := batched.Receipts(0)
	if len(rs) != n-2 {
		t.Fatalf("%d receipts, want %d", len(rs), n-2)
	}
	for _, r := range rs {
		if len(r.Signatures) != 1 || len(r.Signatures[0].Path) == 0 {
			t.Fatalf("receipt of shard %d does not keep the batch path: %+v", r.ShardIndex, r.Signatures)
		}
		if err := r.VerifySignatures(keyOf); err != nil {
			t.Fatalf("receipt of shard %d: %v", r.ShardIndex, err)
		}
	}
}

// twoLeasedMachines returns two machines with signed reports, each with
// the same one-replica job of n shards (named name) all leased to w1.
func twoLeasedMachines(t *testing.T, name string, n int) (a, b *Machine, job content.Ref, pol Policy) {
	t.Helper()
	mk := func() *Machine {
		m, err := New(Config{Regime: trust.Own, DefaultLeaseTTL: 1000, SignedReports: true})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b = mk(), mk()
	job = content.Hash([]byte(name))
	var shards []ShardPlan
	for i := range n {
		shards = append(shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i)}), Price: 1, PriceBasis: "flat"})
	}
	pol = Policy{Replicas: 1}
	for _, c := range []Command{
		SubmitJob{Job: job, Name: "p", Bundle: content.Hash([]byte("b")), Policy: pol, Submitter: "alice", Now: 1, Shards: shards},
		Lease{Peer: "w1", Now: 2, Max: n, Job: job},
	} {
		applyEncoded(t, a, c)
		applyEncoded(t, b, c)
	}
	return a, b, job, pol
}

// applyBatchAndSingly applies reports to batched as one Batch and to
// single one by one: exactly the reports bad says are refused for their
// signature (SC7305) in the batch, the rest accepted, alone as in the
// batch, and both machines reach the same state.
func applyBatchAndSingly(t *testing.T, batched, single *Machine, reports []Command, bad func(i int) bool) {
	t.Helper()
	got := applyEncoded(t, batched, Batch{Commands: reports}).Response.(*BatchResponse).Results
	for i, c := range reports {
		want := applyEncoded(t, single, c)
		if bad(i) {
			wantCode(t, got[i], diag.VerifyBadSignature)
		} else if got[i].Refused() {
			t.Fatalf("report %d refused in the batch: %v", i, got[i].Refusal)
		}
		if got[i].Refused() != want.Refused() {
			t.Fatalf("report %d: batched refused %v, alone %v", i, got[i].Refused(), want.Refused())
		}
	}
	if batched.StateHash() != single.StateHash() {
		t.Fatal("the batch and the reports one by one reach different states")
	}
}
