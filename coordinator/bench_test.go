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
