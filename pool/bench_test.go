package pool

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/job"
)

// trivialPlan is a job of n shards whose program does almost nothing, so
// the benchmarks measure the engine's per-shard overhead.
func trivialPlan(b *testing.B, n int) *job.Plan {
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "p.star"), []byte("def run(params, inputs):\n    return {\"v\": params[\"chunk\"]}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(`name: trivial
program: ./p.star
partitioner: {use: range, params: {count: 1000, chunks: 1000}}
reducer: concat
`), 0o644)
	s, err := job.LoadSpec(filepath.Join(dir, "job.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	cat, _ := catalog.Builtin()
	p, err := job.Compile(context.Background(), s, cat)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkSoloTrivialShards: shards per second through the pool of one
// (parallel execution, result encoding, reduction).
func BenchmarkSoloTrivialShards(b *testing.B) {
	p := trivialPlan(b, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := (&Local{}).Run(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Shards)*b.N)/b.Elapsed().Seconds(), "shards/s")
}

// BenchmarkDirectExecute is the baseline: the same shards executed one after
// another with no pool, no reduction.
func BenchmarkDirectExecute(b *testing.B) {
	p := trivialPlan(b, 1000)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, sh := range p.Shards {
			if _, err := p.Execute(ctx, sh); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(p.Shards)*b.N)/b.Elapsed().Seconds(), "shards/s")
}
