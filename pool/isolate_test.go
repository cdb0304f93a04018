package pool

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
)

// The worker's isolated runs re-execute this binary: as a child, the test
// binary runs the shard handler and exits.
func TestMain(m *testing.M) {
	sandboxproc.Main()
	os.Exit(m.Run())
}

// isolatedWorker compiles a small Monte Carlo job and returns a worker
// ready to run its shards in child processes.
func isolatedWorker(t testing.TB) (*Worker, *job.Plan) {
	dir := t.TempDir()
	builtin, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := job.ParseSpec(filepath.Join(dir, "mc.yaml"), []byte("name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 200000, chunks: 4}}\nreducer: {use: mean, params: {weight: samples}}\n"))
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
	w := &Worker{ProcessMemoryBytes: 512 << 20, ShardTimeout: time.Minute,
		isolated: map[content.Ref]*isolatedJob{p.ID: {bundle: raw, dir: dir}}}
	return w, p
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
