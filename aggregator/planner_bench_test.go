package aggregator

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
)

// BenchmarkPlanIsolation measures what running a submitted plan in a child
// process under RLIMIT_AS costs: planning one 50-shard Monte Carlo bundle
// in this process (the baseline, as before) and in a child, in one run.
// Compare the ns/op: the ratio is the isolation's price per plan. "child"
// is the planner's way (a spare child started ahead, sandboxproc.Warm),
// "child-cold" a child started for each plan (sandboxproc.Run).
func BenchmarkPlanIsolation(b *testing.B) {
	dir := b.TempDir()
	store, err := blob.Open(filepath.Join(dir, "blobs"), 0)
	if err != nil {
		b.Fatal(err)
	}
	builtin, err := catalog.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	spec, err := job.ParseSpec(filepath.Join(dir, "mc.yaml"), []byte("name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 1000000, chunks: 50}}\nreducer: {use: mean, params: {weight: samples}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	pl, err := job.Compile(context.Background(), spec, builtin)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := content.Encode(pl.Bundle())
	if err != nil {
		b.Fatal(err)
	}
	ref, err := store.PutBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	p := newPlanner(store, filepath.Join(dir, "blobs"), builtin, filepath.Join(dir, "plans"), ContentCaps{})
	defer p.close()
	req := planRequest{Bundle: ref, BlobDir: p.blobDir, CacheDir: p.cacheDir, Caps: p.wireCaps()}
	enc, err := content.Encode(req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("in-process", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := childPlan(context.Background(), enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("child", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := p.inChild(context.Background(), planHandler, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("child-cold", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := sandboxproc.Run(context.Background(), planHandler, p.caps.processLimits(), enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
