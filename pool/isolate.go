package pool

import (
	"context"
	"errors"
	"fmt"

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
	req, err := content.Encode(job.ShardRequest{
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

// childShard runs in the child process: the request carries the bundle,
// its sources and the cache folder that already holds its inputs.
func childShard(ctx context.Context, raw []byte) ([]byte, error) {
	var req job.ShardRequest
	if err := content.Decode(raw, &req); err != nil {
		return nil, err
	}
	res, err := req.Execute(ctx)
	if err != nil {
		return nil, err
	}
	return res.Bytes, nil
}
