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

// shardSession runs the shards of one job in a child process
// (internal/sandboxproc), so the operating system bounds what the
// submitter's program can take from the worker: its address space
// (RLIMIT_AS) and its wall clock. A child compiles the job once and serves
// a run of its shards, each in a fresh interpreter thread; it is retired
// after a failed shard, after MaxShardsPerChild shards (more for a very
// large job: shardsPerChild), and once it holds
// more memory than the shard budget (sandboxproc's sessions).
const shardSession = "pool.shards"

// MaxShardsPerChild is how many shards one child runs before a new one
// takes over: its start (about 30–200 ms) is then under a millisecond a
// shard, and nothing a child accumulates outlives a few seconds of work.
// A job of more shards than childRuns × MaxShardsPerChild lets a child
// run a childRuns-th of it instead (shardsPerChild): a new child compiles
// the whole job again (its partition and every shard's cost, ~13 µs a
// shard), which for 10^5 shards is a second, and once per 1,000 shards
// that would be a millisecond a shard.
const MaxShardsPerChild = 1000

// childRuns bounds how many children in a row one run slot starts for a
// large job (shardsPerChild).
const childRuns = 8

// shardsPerChild is how many shards of a job of n shards one child runs.
func shardsPerChild(n int) int { return max(MaxShardsPerChild, n/childRuns) }

// ChildOverhead is the address space a shard's child should be allowed
// beyond the content's memory budget: the engine, the job's input tables
// (loaded outside the content budget) and the Go heap's slack.
const ChildOverhead = 256 << 20

func init() { sandboxproc.RegisterSession(shardSession, childShards) }

// executeIsolated runs shard sh of p in a child process and returns its
// result, checked like any result received from elsewhere (DecodeResult).
func (w *Worker) executeIsolated(ctx context.Context, p *job.Plan, sh job.Shard) (*job.Result, error) {
	w.mu.Lock()
	in := w.isolated[p.ID]
	w.mu.Unlock()
	if in == nil {
		return nil, errors.New("no bundle kept for the isolated run")
	}
	setup := func() ([]byte, error) {
		sources, _ := p.Blobs()
		return content.Encode(job.ShardRequest{
			Bundle: in.bundle, Sources: sources, CacheDir: in.dir, Job: p.ID, MemoryBytes: w.MemoryBytes,
		})
	}
	req, err := content.Encode(childShard{Index: sh.Index, ID: sh.ID, Params: sh.Params})
	if err != nil {
		return nil, err
	}
	lim := w.childLimits(len(p.Shards))
	out, err := w.children.Do(ctx, string(p.ID), shardSession, lim, setup, req)
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

// childLimits are the limits of the shard children of a job of shards
// shards: the address space and wall clock of ProcessMemoryBytes and
// ShardTimeout, retired once they hold more than the content's memory
// budget or have run shardsPerChild shards.
func (w *Worker) childLimits(shards int) sandboxproc.SessionLimits {
	recycle := w.MemoryBytes
	if recycle == 0 {
		recycle = w.ProcessMemoryBytes / 2
	}
	return sandboxproc.SessionLimits{
		Limits:      sandboxproc.Limits{MemoryBytes: w.ProcessMemoryBytes, WallClock: w.ShardTimeout, Nice: w.ProcessNice},
		MaxRequests: shardsPerChild(shards), RecycleBytes: recycle,
	}
}

// childShard is one request to a shard child: the shard whole, from the
// worker's plan, so the child need not partition the job (a partition of
// thousands of shards was most of a child's start); the child checks it
// is the job's shard (job.Plan.ExecuteHanded).
type childShard struct {
	Index  int            `cbor:"index"`
	ID     content.Ref    `cbor:"id"`
	Params map[string]any `cbor:"params"`
}

// childShards runs in the child process: the setup carries the bundle,
// its sources and the cache folder that already holds its inputs; each
// request is a shard to run (childShard).
func childShards(ctx context.Context, raw []byte) (sandboxproc.Handler, error) {
	var req job.ShardRequest
	if err := content.Decode(raw, &req); err != nil {
		return nil, err
	}
	p, err := req.CompileRunner(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, b []byte) ([]byte, error) {
		var sh childShard
		if err := content.Decode(b, &sh); err != nil {
			return nil, fmt.Errorf("shard request: %w", err)
		}
		res, err := p.ExecuteHanded(ctx, job.Shard{Index: sh.Index, ID: sh.ID, Params: sh.Params})
		if err != nil {
			return nil, err
		}
		return res.Bytes, nil
	}, nil
}
