package pool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/internal/testharness"
	"github.com/scellis/scellis/job"
)

// The worker's isolated runs re-execute this binary: as a child, the test
// binary runs the shard handler and exits.
func TestMain(m *testing.M) {
	sandboxproc.Main()
	testharness.Main(m) // nothing the tests start or make outlives them
}

// isolatedWorker compiles a small Monte Carlo job and returns a worker
// ready to run its shards in child processes.
func isolatedWorker(t testing.TB) (*Worker, *job.Plan) {
	dir := t.TempDir()
	p, raw := compileSpec(t, dir, "name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 200000, chunks: 4}}\nreducer: {use: mean, params: {weight: samples}}\n")
	w := &Worker{ProcessMemoryBytes: 512 << 20, ShardTimeout: time.Minute,
		isolated: map[content.Ref]*isolatedJob{p.ID: {bundle: raw, dir: dir}}}
	return w, p
}

// compileSpec compiles the job spec text (its files in dir) and returns
// the plan and its bundle's canonical bytes, as a worker keeps them.
func compileSpec(t testing.TB, dir, text string) (*job.Plan, []byte) {
	builtin, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := job.ParseSpec(filepath.Join(dir, "job.yaml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	p, err := job.Compile(context.Background(), spec, builtin)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := content.Encode(p.Bundle())
	if err != nil {
		t.Fatal(err)
	}
	return p, raw
}

// A shard run in a child process gives the byte-identical result of the
// same shard run in this process.
func TestIsolatedShardMatchesInProcess(t *testing.T) {
	w, p := isolatedWorker(t)
	sh := p.Shards[2]
	want, err := p.Execute(context.Background(), sh)
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.executeIsolated(context.Background(), p, sh)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash != want.Hash || !bytes.Equal(got.Bytes, want.Bytes) {
		t.Fatalf("isolated result %s, in-process %s", got.Hash.Short(), want.Hash.Short())
	}
}

// A shard child is handed each shard whole and does not partition the
// job itself; it runs only a shard of the job: one whose parameters were
// changed, or which is handed under another shard's index, is refused
// (its ID is the hash of job, index and parameters).
func TestIsolatedChildRefusesAForeignShard(t *testing.T) {
	w, p := isolatedWorker(t)
	changed := p.Shards[1]
	changed.Params = map[string]any{"samples": int64(1), "chunk": int64(1)}
	moved := p.Shards[1]
	moved.Index = 3
	for name, sh := range map[string]job.Shard{"changed parameters": changed, "another index": moved} {
		if _, err := w.executeIsolated(context.Background(), p, sh); err == nil || !strings.Contains(err.Error(), "is not one of its shards") {
			t.Errorf("%s: ran, or failed for another reason: %v", name, err)
		}
	}
	// The child that refused is retired; the next shard gets a new one
	// and runs.
	if _, err := w.executeIsolated(context.Background(), p, p.Shards[0]); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkChildSetup: what a shard child does before its first shard
// of a 2,000-shard trivial sweep — compile the job from its bundle — with
// the partition (as children did) and without it (CompileRunner: the
// worker hands each shard whole), in one run.
//
//	go test -run '^$' -bench ChildSetup ./pool/
func BenchmarkChildSetup(b *testing.B) {
	n := 2000
	if testing.Short() {
		n = 100
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.star"), []byte("def run(params, inputs):\n    return {\"v\": params[\"chunk\"]}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	p, raw := compileSpec(b, dir, fmt.Sprintf("name: sweep\nprogram: ./p.star\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: concat\n", n, n))
	sources, _ := p.Blobs()
	req := job.ShardRequest{Bundle: raw, Sources: sources, Job: p.ID}
	for _, c := range []struct {
		name    string
		compile func(context.Context) (*job.Plan, error)
	}{{"partitioned", req.Compile}, {"runner", req.CompileRunner}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.compile(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkShardIsolation: one Monte Carlo shard in this process (the
// baseline) and in a child process, in one run; the ratio of the two
// ns/op is the isolation's price per shard.
func BenchmarkShardIsolation(b *testing.B) {
	w, p := isolatedWorker(b)
	sh := p.Shards[0]
	b.Run("in-process", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := p.Execute(context.Background(), sh); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("child", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := w.executeIsolated(context.Background(), p, sh); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A shard that exhausts its memory budget in a shared child is stopped
// with SC2005, retires that child, and does not touch the result of the
// shards before and after it, which match their in-process runs byte for
// byte — by the sandbox's guard (a list too large for the budget) and by
// the OS (RLIMIT_AS, the guard given more room than the process has).
func TestSharedChildMemoryExhaustion(t *testing.T) {
	for _, c := range []struct {
		name          string
		contentBudget uint64 // the worker's memory_mb: the guard's limit
		process       uint64 // the child's address-space allowance
		says          string // what the diagnostic says stopped it
	}{
		{"guard", 64 << 20, 512 << 20, "budget"},
		{"rlimit", 4 << 30, 256 << 20, "address-space limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			prog := "def run(params, inputs):\n" +
				"    if params[\"chunk\"] == 1:\n" +
				"        hog = []\n" +
				"        for i in range(1000):\n" +
				"            hog.append([i] * 1000000)\n" +
				"        return {\"n\": len(hog)}\n" +
				"    return {\"v\": params[\"chunk\"] * 3}\n"
			if err := os.WriteFile(filepath.Join(dir, "p.star"), []byte(prog), 0o644); err != nil {
				t.Fatal(err)
			}
			p, raw := compileSpec(t, dir, "name: hog\nprogram: ./p.star\npartitioner: {use: range, params: {count: 4, chunks: 4}}\nreducer: concat\n")
			w := &Worker{MemoryBytes: c.contentBudget, ProcessMemoryBytes: c.process, ShardTimeout: time.Minute,
				isolated: map[content.Ref]*isolatedJob{p.ID: {bundle: raw, dir: dir}}}
			defer w.children.Close()
			for _, i := range []int{0, 2, 1, 3} {
				got, err := w.executeIsolated(context.Background(), p, p.Shards[i])
				if i == 1 {
					ds, ok := diag.As(err)
					if !ok || ds[0].Code != diag.MemoryBudget {
						t.Fatalf("the hog: %v, want SC2005", err)
					}
					if !strings.Contains(ds[0].Message, c.says) {
						t.Fatalf("the hog was stopped by %q, want the %s", ds[0].Message, c.name)
					}
					if w.children.Idle() != 0 {
						t.Fatalf("the hog's child was kept for the next shard")
					}
					continue
				}
				if err != nil {
					t.Fatalf("shard %d: %v", i, err)
				}
				want, err := p.Execute(context.Background(), p.Shards[i])
				if err != nil {
					t.Fatal(err)
				}
				if got.Hash != want.Hash || !bytes.Equal(got.Bytes, want.Bytes) {
					t.Fatalf("shard %d: shared child %s, in process %s", i, got.Hash.Short(), want.Hash.Short())
				}
				if w.children.Idle() != 1 {
					t.Fatalf("after shard %d: %d idle children, want the one that ran it", i, w.children.Idle())
				}
			}
		})
	}
}

// A child runs 1,000 shards of a job, or an eighth of a larger one: a new
// child compiles the whole job again.
func TestShardsPerChild(t *testing.T) {
	for n, want := range map[int]int{1: 1000, 8000: 1000, 8008: 1001, 100_000: 12_500} {
		if got := shardsPerChild(n); got != want {
			t.Errorf("a job of %d shards: %d a child, want %d", n, got, want)
		}
		if got := (&Worker{}).childLimits(n).MaxRequests; got != shardsPerChild(n) {
			t.Errorf("a job of %d shards: children retire after %d", n, got)
		}
	}
}
