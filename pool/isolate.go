package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
)

// shardHandler runs one shard of a job in a child process
// (internal/sandboxproc), so the operating system bounds what the
// submitter's program can take from the worker: its address space
// (RLIMIT_AS) and its wall clock.
const shardHandler = "pool.shard"

// ChildOverhead is the address space a shard's child should be allowed
// beyond the content's memory budget: the engine, the job's input tables
// (loaded outside the content budget) and the Go heap's slack.
const ChildOverhead = 256 << 20

func init() { sandboxproc.Register(shardHandler, childShard) }

// shardRequest carries everything the child needs without a network
// client: the bundle, the sources of its content, and the cache folder that
// already holds its inputs (re-hashed by the child before use).
type shardRequest struct {
	Bundle      []byte                 `cbor:"bundle"`
	Sources     map[content.Ref][]byte `cbor:"sources"`
	CacheDir    string                 `cbor:"cache_dir"`
	Job         content.Ref            `cbor:"job"`
	Shard       int                    `cbor:"shard"`
	MemoryBytes uint64                 `cbor:"memory_bytes"`
}

// executeIsolated runs shard sh of p in a child process and returns its
// result, checked like any result received from elsewhere (DecodeResult).
func (w *Worker) executeIsolated(ctx context.Context, p *job.Plan, sh job.Shard) (*job.Result, error) {
	w.mu.Lock()
	in := w.isolated[p.ID]
	w.mu.Unlock()
	if in == nil {
		return nil, errors.New("no bundle kept for the isolated run")
	}
	sources, _ := p.Blobs()
	req, err := content.Encode(shardRequest{
		Bundle: in.bundle, Sources: sources, CacheDir: in.dir, Job: p.ID, Shard: sh.Index, MemoryBytes: w.MemoryBytes,
	})
	if err != nil {
		return nil, err
	}
	lim := sandboxproc.Limits{MemoryBytes: w.ProcessMemoryBytes, WallClock: w.ShardTimeout}
	out, err := sandboxproc.Run(ctx, shardHandler, lim, req)
	switch {
	case errors.Is(err, sandboxproc.ErrMemory):
		return nil, diag.New(diag.MemoryBudget, fmt.Sprintf("shard %d", sh.Index), "the shard's process exceeded this worker's address-space limit of %d MiB", lim.MemoryBytes>>20)
	case errors.Is(err, sandboxproc.ErrTimeout):
		return nil, diag.New(diag.ContentCancelled, fmt.Sprintf("shard %d", sh.Index), "the shard ran past this worker's shard_timeout of %s and was killed", w.ShardTimeout)
	case err != nil:
		return nil, err
	}
	return job.DecodeResult(sh, out)
}

func childShard(ctx context.Context, raw []byte) ([]byte, error) {
	var req shardRequest
	if err := content.Decode(raw, &req); err != nil {
		return nil, err
	}
	var b job.Bundle
	if err := content.Decode(req.Bundle, &b); err != nil {
		return nil, err
	}
	builtin, err := catalog.Builtin()
	if err != nil {
		return nil, err
	}
	fetch := func(_ context.Context, ref content.Ref) ([]byte, error) {
		if s, ok := req.Sources[ref]; ok {
			return s, nil
		}
		return nil, fmt.Errorf("blob %s was not handed to the shard's process", ref.Short())
	}
	p, err := job.CompileBundle(ctx, &b, builtin, fetch, req.CacheDir)
	if err != nil {
		return nil, err
	}
	if p.ID != req.Job {
		return nil, fmt.Errorf("bundle compiles to job %s, not %s", p.ID.Short(), req.Job.Short())
	}
	if req.Shard < 0 || req.Shard >= len(p.Shards) {
		return nil, fmt.Errorf("job %s has no shard %d", p.ID.Short(), req.Shard)
	}
	p.CapMemory(req.MemoryBytes)
	res, err := p.Execute(ctx, p.Shards[req.Shard])
	if err != nil {
		return nil, err
	}
	return res.Bytes, nil
}
