package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/trust"
)

// JobReceipts lists what the chain filtered by job lists, in chain order.
func TestJobReceipts(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	var jobs []content.Ref
	for _, name := range []string{"a", "b"} {
		sub := SubmitJob{Job: content.Hash([]byte(name)), Name: name, Bundle: content.Hash([]byte("bundle " + name)), Submitter: "alice", Now: 1}
		for i := 0; i < 3; i++ {
			sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(name + string(rune('0'+i)))), Price: 1, PriceBasis: "flat"})
		}
		applyEncoded(t, m, sub)
		jobs = append(jobs, sub.Job)
	}
	applyEncoded(t, m, Lease{Peer: "w1", Now: 2, Max: 6})
	for i := 0; i < 3; i++ { // interleaved: b's shard, then a's
		for _, j := range []content.Ref{jobs[1], jobs[0]} {
			if r := applyEncoded(t, m, ReportResult{Peer: "w1", Job: j, Shard: i, Result: content.Hash([]byte{byte(i)}), Now: 3}); r.Refused() {
				t.Fatal(r.Refusal)
			}
		}
	}
	for _, j := range jobs {
		var want []content.Ref
		for _, r := range m.Receipts(0) {
			if r.Job == j {
				want = append(want, r.Hash)
			}
		}
		got := m.JobReceipts(j)
		if len(want) != 3 || len(got) != len(want) {
			t.Fatalf("job %s: %d receipts, want %d (3)", j.Short(), len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("job %s receipt %d: %s, want %s", j.Short(), i, got[i].Short(), want[i].Short())
			}
		}
	}
	if got := m.JobReceipts(content.Hash([]byte("none"))); got == nil || len(got) != 0 {
		t.Fatalf("a job without receipts: %v", got)
	}
}

// JobsIn returns the jobs in the given states as Jobs does, counts aside.
func TestJobsIn(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	var jobs []content.Ref
	for _, name := range []string{"a", "b", "c"} {
		sub := SubmitJob{Job: content.Hash([]byte(name)), Name: name, Bundle: content.Hash([]byte("bundle " + name)), Submitter: "alice", Now: 1}
		sub.Shards = []ShardPlan{{Index: 0, ID: content.Hash([]byte(name)), Price: 1, PriceBasis: "flat"}}
		applyEncoded(t, m, sub)
		jobs = append(jobs, sub.Job)
	}
	applyEncoded(t, m, Lease{Peer: "w1", Now: 2, Max: 1, Job: jobs[1]})
	applyEncoded(t, m, ReportResult{Peer: "w1", Job: jobs[1], Shard: 0, Result: content.Hash([]byte("r")), Now: 3})
	all := m.Jobs()
	if all[1].State != JobDecided {
		t.Fatalf("job b: %s", all[1].State)
	}
	for _, c := range []struct {
		states []JobState
		want   []int
	}{{[]JobState{JobDecided}, []int{1}}, {[]JobState{JobRunning}, []int{0, 2}}, {[]JobState{JobRunning, JobDecided}, []int{0, 1, 2}}, {[]JobState{JobDone}, nil}} {
		got := m.JobsIn(c.states...)
		if len(got) != len(c.want) {
			t.Fatalf("%v: %d jobs, want %d", c.states, len(got), len(c.want))
		}
		for i, k := range c.want {
			want := all[k]
			want.Counts = got[i].Counts
			if got[i].Counts.Total != 0 || got[i].ID != want.ID || got[i].State != want.State || got[i].Bundle != want.Bundle || got[i].Policy != want.Policy {
				t.Fatalf("%v: job %d is %+v, want %+v without counts", c.states, i, got[i], want)
			}
		}
	}
}
