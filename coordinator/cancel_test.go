package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

func TestCancelJob(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	job := content.Hash([]byte("j"))
	sub := SubmitJob{Job: job, Name: "j", Bundle: content.Hash([]byte("b")), Submitter: "alice", Now: 1}
	for i := 0; i < 3; i++ {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i)}), Price: 1, PriceBasis: "flat"})
	}
	applyEncoded(t, m, sub)
	applyEncoded(t, m, Lease{Peer: "w1", Now: 2, Max: 3})
	applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: content.Hash([]byte("r0")), Now: 3})

	// Only the submitter and operators may cancel; a refusal changes nothing.
	before := m.StateHash()
	wantCode(t, applyEncoded(t, m, CancelJob{Job: job, Peer: "bob", Now: 4}), diag.PoolForbidden)
	if m.StateHash() != before {
		t.Fatal("a refused cancel changed the state")
	}
	// The same job submitted again by someone else stays alice's.
	again := sub
	again.Submitter, again.Now = "bob", 4
	if r := applyEncoded(t, m, again); r.Refused() || !r.Response.(*SubmitResponse).Existing {
		t.Fatalf("resubmission by another member: %+v", r)
	}
	if st, _ := m.Job(job); st.Submitter != "alice" {
		t.Fatalf("submitter %q, want alice", st.Submitter)
	}
	r := applyEncoded(t, m, CancelJob{Job: job, Peer: "alice", Reason: "shard 1 fails everywhere", Now: 4})
	if r.Refused() {
		t.Fatal(r.Refusal)
	}
	resp := r.Response.(*CancelResponse)
	if resp.State != JobCancelledState || len(resp.Flagged) != 2 {
		t.Fatalf("%+v", resp)
	}
	st, _ := m.Job(job)
	if st.State != JobCancelledState || st.Counts.Verified != 1 || st.Counts.Unverified != 2 || st.Counts.Leased != 0 {
		t.Fatalf("after cancel: %+v", st.Counts)
	}
	if g := applyEncoded(t, m, Lease{Peer: "w2", Now: 5, Max: 3}).Response.(*LeaseResponse).Grants; len(g) != 0 {
		t.Fatalf("a cancelled job's shard was leased: %+v", g)
	}
	wantCode(t, applyEncoded(t, m, ReportReduced{Job: job, Peer: "agg", Reduced: content.Hash([]byte("x")), Now: 6}), diag.PoolJobCancelled)
	if r := applyEncoded(t, m, CancelJob{Job: job, Peer: "ops", Operator: true, Now: 7}); r.Refused() {
		t.Fatalf("a retried cancel by an operator was refused: %v", r.Refusal)
	}
	// The state survives a snapshot.
	m2, _ := New(Config{Regime: trust.Own})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}

// TestHasJob: HasJob refuses an unknown job as Job does and accepts a
// submitted one.
func TestHasJob(t *testing.T) {
	m, err := New(Config{Regime: trust.Own})
	if err != nil {
		t.Fatal(err)
	}
	id := content.Hash([]byte("has-job"))
	if ds, ok := diag.As(m.HasJob(id)); !ok || ds[0].Code != diag.PoolUnknownJob {
		t.Fatalf("unknown job: %v", m.HasJob(id))
	}
	sub := SubmitJob{Job: id, Name: "j", Bundle: content.Hash([]byte("b")), Policy: Policy{Replicas: 1}, Now: 1,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte("s0")), Price: 1, PriceBasis: "flat"}}}
	if r := m.Apply(sub); r.Refused() {
		t.Fatal(r.Err())
	}
	if err := m.HasJob(id); err != nil {
		t.Fatalf("submitted job: %v", err)
	}
}
