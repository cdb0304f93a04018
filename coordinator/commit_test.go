package coordinator

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

func nonceOf(b byte) (string, []byte) {
	n := bytes.Repeat([]byte{b}, NonceBytes)
	return hex.EncodeToString(n), n
}

// The commit–reveal rules, step by step: no report without a commitment,
// no reveal before the quorum of commitments (or the window), a reveal
// must open the peer's own commitment, a committed peer keeps its lease,
// and a peer that never reveals is recorded as timed out.
func TestCommitReveal(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 1000, CommitReveal: true})
	job := content.Hash([]byte("j"))
	sub := SubmitJob{Job: job, Name: "j", Bundle: content.Hash([]byte("b")), Submitter: "alice", Now: 1}
	for i := 0; i < 2; i++ {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte{byte(i)}), Price: 3, PriceBasis: "flat"})
	}
	applyEncoded(t, m, sub)
	for _, p := range []string{"w1", "w2", "lazy"} {
		applyEncoded(t, m, Lease{Peer: p, Now: 2, Max: 1})
	}
	good := content.Hash([]byte("good"))
	n1, b1 := nonceOf(1)
	n2, b2 := nonceOf(2)

	// The old way — report a hash outright — is refused.
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: good, Now: 3}), diag.PoolNoCommitment)
	r := applyEncoded(t, m, CommitResult{Peer: "w1", Job: job, Shard: 0, Commitment: Commitment(good, "w1", job, 0, b1), Now: 3})
	if resp := r.Response.(*CommitResponse); resp.Reveal || resp.Commits != 1 || resp.RevealAt != 1003 {
		t.Fatalf("first commitment: %+v", resp)
	}
	// Before the second commitment the reveal is closed.
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: good, Nonce: n1, Now: 4}), diag.PoolRevealEarly)
	if open, _ := m.RevealOpen(job, 0, 4); open {
		t.Fatal("RevealOpen says open before the quorum")
	}
	// A copied commitment does not open for the copier.
	r = applyEncoded(t, m, CommitResult{Peer: "w2", Job: job, Shard: 0, Commitment: Commitment(good, "w1", job, 0, b1), Now: 5})
	if resp := r.Response.(*CommitResponse); !resp.Reveal || resp.Commits != 2 {
		t.Fatalf("second commitment: %+v", resp)
	}
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w2", Job: job, Shard: 0, Result: good, Nonce: n1, Now: 6}), diag.PoolRevealMismatch)
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: good, Nonce: n2, Now: 6}), diag.PoolRevealMismatch)
	// A second, different commitment is refused.
	wantCode(t, applyEncoded(t, m, CommitResult{Peer: "w2", Job: job, Shard: 0, Commitment: Commitment(good, "w2", job, 0, b2), Now: 6}), diag.PoolReportConflict)
	if r := applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: good, Nonce: n1, Now: 7}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	// w2 committed blind to w1's commitment and cannot open it: the shard
	// needs another peer; lazy's lease on shard 1 runs out unreported.
	st, _ := m.Job(job)
	if st.Shards[0].State != StateLeased || len(st.Shards[0].Commits) != 2 {
		t.Fatalf("shard 0: %+v", st.Shards[0])
	}
	applyEncoded(t, m, Tick{Now: 2000})
	if g := applyEncoded(t, m, Lease{Peer: "w3", Now: 2001, Max: 2}).Response.(*LeaseResponse).Grants; len(g) != 2 {
		t.Fatalf("w3 grants %+v", g)
	}
	_, b3 := nonceOf(3)
	applyEncoded(t, m, CommitResult{Peer: "w3", Job: job, Shard: 0, Commitment: Commitment(good, "w3", job, 0, b3), Now: 2002})
	if r := applyEncoded(t, m, ReportResult{Peer: "w3", Job: job, Shard: 0, Result: good, Nonce: hex.EncodeToString(b3), Now: 2003}); r.Refused() || r.Response.(*ReportResponse).Outcome != OutcomeVerified {
		t.Fatalf("w3's reveal: %+v", r)
	}
	// Shard 1: a lone commitment opens after one lease TTL.
	applyEncoded(t, m, CommitResult{Peer: "w3", Job: job, Shard: 1, Commitment: Commitment(good, "w3", job, 1, b3), Now: 2004})
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w3", Job: job, Shard: 1, Result: good, Nonce: hex.EncodeToString(b3), Now: 2005}), diag.PoolRevealEarly)
	if open, at := m.RevealOpen(job, 1, 3004); !open || at != 3004 {
		t.Fatalf("RevealOpen after the window: %v %d", open, at)
	}
	peers := map[string]PeerRecord{}
	for _, p := range m.Peers() {
		peers[p.Peer] = p
	}
	if peers["lazy"].Expired != 1 || peers["lazy"].WorkUnits != 0 || peers["w2"].WorkUnits != 0 || peers["w1"].WorkUnits != 3 {
		t.Fatalf("peer records: %+v", peers)
	}
	m2, _ := New(Config{Regime: trust.Own})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}

// Without CommitReveal (a pool measuring its cost) a report needs no
// commitment, but one given is still checked.
func TestCommitOptional(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	job := content.Hash([]byte("j"))
	applyEncoded(t, m, SubmitJob{Job: job, Name: "j", Bundle: content.Hash([]byte("b")), Now: 1,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte{0}), Price: 1, PriceBasis: "flat"}, {Index: 1, ID: content.Hash([]byte{1}), Price: 1, PriceBasis: "flat"}}})
	applyEncoded(t, m, Lease{Peer: "w1", Now: 2, Max: 2})
	if r := applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: content.Hash([]byte("x")), Now: 3}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	n, b := nonceOf(9)
	applyEncoded(t, m, CommitResult{Peer: "w1", Job: job, Shard: 1, Commitment: Commitment(content.Hash([]byte("y")), "w1", job, 1, b), Now: 4})
	wantCode(t, applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 1, Result: content.Hash([]byte("z")), Nonce: n, Now: 5}), diag.PoolRevealMismatch)
}

// A one-replica shard is decided by its first report: in a commit–reveal
// pool that report may come outright, and nothing a second peer reports
// afterwards earns anything.
func TestOneReplicaNeedsNoCommitment(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own, CommitReveal: true})
	job := content.Hash([]byte("j"))
	applyEncoded(t, m, SubmitJob{Job: job, Name: "j", Bundle: content.Hash([]byte("b")), Now: 1,
		Shards: []ShardPlan{{Index: 0, ID: content.Hash([]byte{0}), Price: 1, PriceBasis: "flat"}}})
	applyEncoded(t, m, Lease{Peer: "w1", Now: 2})
	r := applyEncoded(t, m, ReportResult{Peer: "w1", Job: job, Shard: 0, Result: content.Hash([]byte("x")), Now: 3})
	if r.Refused() || r.Response.(*ReportResponse).Outcome != OutcomeVerified {
		t.Fatalf("a one-replica report: %+v", r)
	}
}
