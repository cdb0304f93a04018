package coordinator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/trust"
)

// BenchmarkShardThroughput measures lease → report → verify → receipt for
// one shard with two replicas, applied directly (no Raft, no encoding).
func BenchmarkShardThroughput(b *testing.B) {
	m, _ := New(Config{Regime: trust.Consortium})
	sub := SubmitJob{Job: content.Hash([]byte("bench")), Name: "bench"}
	for i := 0; i < b.N; i++ {
		sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprint(i))), Price: 1, PriceBasis: "flat 1 per shard"})
	}
	if r := m.Apply(sub); r.Refused() {
		b.Fatal(r.Refusal)
	}
	res := content.Hash([]byte("r"))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := int64(i)
		for _, p := range []string{"w1", "w2"} {
			r := m.Apply(Lease{Peer: p, Now: now})
			g := r.Response.(*LeaseResponse).Grants[0]
			if rr := m.Apply(ReportResult{Peer: p, Job: g.Job, Shard: g.Shard, Result: res, Now: now}); rr.Refused() {
				b.Fatal(rr.Refusal)
			}
		}
	}
	b.StopTimer()
	if seq, _ := m.Head(); seq != uint64(b.N) {
		b.Fatalf("%d receipts for %d shards", seq, b.N)
	}
}

// BenchmarkResultUse: whether a blob is an undecided result (asked at
// every blob read) in a pool that has run 20 jobs of 2,000 shards, by the
// machine's index and, as the baseline in the same run, by a scan of
// every report (what ResultUse did before). The ref asked is no result,
// as for a bundle: the scan's worst case and its common one.
//
//	go test -run '^$' -bench ResultUse ./coordinator/
func BenchmarkResultUse(b *testing.B) {
	jobs, shards := 20, 2000
	if testing.Short() {
		jobs, shards = 2, 200
	}
	m, _ := New(Config{Regime: trust.Own})
	for j := 0; j < jobs; j++ {
		sub := SubmitJob{Job: content.Hash([]byte(fmt.Sprint("job", j))), Name: "bench"}
		for i := 0; i < shards; i++ {
			sub.Shards = append(sub.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprint(j, "/", i))), Price: 1, PriceBasis: "flat"})
		}
		if r := m.Apply(sub); r.Refused() {
			b.Fatal(r.Refusal)
		}
		for i := 0; i < shards; i++ {
			g := m.Apply(Lease{Peer: "w1", Now: 1}).Response.(*LeaseResponse).Grants[0]
			if r := m.Apply(ReportResult{Peer: "w1", Job: g.Job, Shard: g.Shard, Result: content.Hash([]byte(fmt.Sprint(j, "/", i, "/r"))), Now: 1}); r.Refused() {
				b.Fatal(r.Refusal)
			}
		}
	}
	bundle := content.Hash([]byte("a bundle"))
	for _, c := range []struct {
		name string
		use  func(content.Ref) ResultUse
	}{{"index", m.ResultUse}, {"scan", func(ref content.Ref) ResultUse { return scanResultUse(m, ref) }}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if u := c.use(bundle); u.Undecided || len(u.Decided) > 0 {
					b.Fatalf("a bundle's ref is a result: %+v", u)
				}
			}
			b.ReportMetric(float64(jobs*shards), "reports")
		})
	}
}

// BenchmarkVolunteerLease: a lease of 8 shards and their reports on an
// open pool's job of 10,000 shards, for a browser volunteer (its keyed
// shard order: a Feistel permutation per lease, and the standing and
// origin rules) and, as the baseline in the same run, for a member (index
// order). vs_member is the volunteer's time per lease over the member's.
//
//	go test -run '^$' -bench VolunteerLease ./coordinator/
func BenchmarkVolunteerLease(b *testing.B) {
	n := 10000
	if testing.Short() {
		n = 200
	}
	var perLease [2]float64
	for i, who := range []string{"w1", volunteerNamed(1)} {
		b.Run([]string{"member", "volunteer"}[i], func(b *testing.B) {
			m, _ := New(Config{Regime: trust.Open, DefaultLeaseTTL: MaxLeaseTTL})
			sub := SubmitJob{Job: content.Hash([]byte("bench")), Name: "bench", Policy: Policy{Replicas: 2}, Seed: "5d1c0a7e93b24f68a0e1c2d3b4a59687"}
			for s := 0; s < n; s++ {
				sub.Shards = append(sub.Shards, ShardPlan{Index: s, ID: content.Hash([]byte(fmt.Sprint(s))), Price: 1, PriceBasis: "flat"})
			}
			if r := m.Apply(sub); r.Refused() {
				b.Fatal(r.Refusal)
			}
			earnStanding(m, who)
			res := content.Hash([]byte("r"))
			b.ResetTimer()
			for k := 0; k < b.N; k++ {
				r := m.Apply(Lease{Peer: who, Origin: "198.51.100.0/24", Now: int64(k + 2), Max: 8})
				if r.Refused() {
					b.Fatal(r.Refusal)
				}
				gs := r.Response.(*LeaseResponse).Grants
				if len(gs) == 0 {
					b.StopTimer() // every shard answered once: a fresh job
					m, _ = New(Config{Regime: trust.Open, DefaultLeaseTTL: MaxLeaseTTL})
					m.Apply(sub)
					earnStanding(m, who)
					b.StartTimer()
					continue
				}
				for _, g := range gs {
					m.Apply(ReportResult{Peer: who, Job: g.Job, Shard: g.Shard, Result: res, Now: int64(k + 2)})
				}
			}
			perLease[i] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if i == 1 && perLease[0] > 0 {
				b.ReportMetric(perLease[1]/perLease[0], "vs_member")
			}
		})
	}
}
