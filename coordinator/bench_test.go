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
