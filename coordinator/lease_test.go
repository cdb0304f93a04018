package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/trust"
)

// A lease response describes each granted job once, as the job's status
// does (bundle, policy), in grant order, also when a retried request is
// answered from its memo: a worker compiles the job from it without
// reading the status.
func TestLeaseDescribesJobs(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium})
	var jobs []content.Ref
	for _, name := range []string{"a", "b"} {
		sub := SubmitJob{Job: content.Hash([]byte(name)), Name: name, Bundle: content.Hash([]byte("bundle " + name)), Submitter: "alice", Now: 1}
		for i := 0; i < 2; i++ {
			sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(name + string(rune('0'+i)))), Price: 1, PriceBasis: "flat"})
		}
		if r := applyEncoded(t, m, sub); r.Refused() {
			t.Fatal(r.Refusal)
		}
		jobs = append(jobs, sub.Job)
	}
	lease := Lease{Peer: "w1", Now: 2, Max: 4, RequestID: "r1"}
	for _, attempt := range []string{"first", "retried"} {
		resp := applyEncoded(t, m, lease).Response.(*LeaseResponse)
		if len(resp.Grants) != 4 || len(resp.Jobs) != 2 {
			t.Fatalf("%s: %d grants, %d jobs: %+v", attempt, len(resp.Grants), len(resp.Jobs), resp)
		}
		for i, l := range resp.Jobs {
			st, _ := m.Job(jobs[i])
			if l.Job != st.ID || l.Bundle != st.Bundle || l.Policy != st.Policy || l.Delegated != nil {
				t.Fatalf("%s: job %d described as %+v; its status says %s %s %+v", attempt, i, l, st.ID, st.Bundle, st.Policy)
			}
		}
	}
	if resp := applyEncoded(t, m, Lease{Peer: "w2", Now: 3, Max: 1, Job: jobs[1]}).Response.(*LeaseResponse); len(resp.Jobs) != 1 || resp.Jobs[0].Job != jobs[1] {
		t.Fatalf("one job's lease: %+v", resp)
	}
	if resp := applyEncoded(t, m, Lease{Peer: "w1", Now: 4, Max: 1}).Response.(*LeaseResponse); len(resp.Grants) != 0 || resp.Jobs != nil {
		t.Fatalf("no grants, yet %+v", resp)
	}
}
