package job

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
)

// ShardRequest is one shard of a bundled job with everything needed to
// run it and nothing else: no network client, no store. A worker's
// isolated child process (pool) and the browser worker compiled to
// WebAssembly (cmd/scellis-wasm) both take it in canonical encoding, so
// the two run exactly the same code path from the same bytes.
type ShardRequest struct {
	// Bundle is the job's bundle in canonical encoding.
	Bundle []byte `cbor:"bundle"`
	// Sources are the bundle's content sources by ref (re-hashed before use).
	Sources map[content.Ref][]byte `cbor:"sources"`
	// CacheDir is the folder that holds the job's inputs (re-hashed before
	// use); empty when the job has none, as in a browser, which has no files.
	CacheDir string `cbor:"cache_dir"`
	// Job is the ID the bundle must compile to.
	Job content.Ref `cbor:"job"`
	// Shard is the index of the shard to run.
	Shard int `cbor:"shard"`
	// MemoryBytes caps the content's memory budget (0: the job's own).
	MemoryBytes uint64 `cbor:"memory_bytes"`
}

// Execute compiles the bundle against the builtin catalog, checks that it
// is the job the request names, and runs the one shard under the same
// step and memory budgets as any other worker.
func (r *ShardRequest) Execute(ctx context.Context) (*Result, error) {
	p, err := r.Compile(ctx)
	if err != nil {
		return nil, err
	}
	return p.ExecuteIndex(ctx, r.Shard)
}

// Compile compiles the bundle against the builtin catalog, checks that it
// is the job the request names and caps its memory budget: the plan every
// shard of the request's job runs from (Shard is not read).
func (r *ShardRequest) Compile(ctx context.Context) (*Plan, error) {
	return r.compile(ctx, true)
}

// CompileRunner is Compile without the partition: the plan runs the
// shards it is handed whole (Execute) and lists none. A worker's shard
// child, handed each shard (index, ID, parameters) by the worker that
// compiled the whole job and checked it against the lease, does not run
// the partitioner again; for a job of thousands of shards that was most
// of a child's start.
func (r *ShardRequest) CompileRunner(ctx context.Context) (*Plan, error) {
	return r.compile(ctx, false)
}

func (r *ShardRequest) compile(ctx context.Context, partition bool) (*Plan, error) {
	var b Bundle
	if err := content.Decode(r.Bundle, &b); err != nil {
		return nil, err
	}
	if len(b.Inputs) > 0 && r.CacheDir == "" {
		return nil, fmt.Errorf("job %s has inputs and the request gives no folder to hold them", r.Job.Short())
	}
	builtin, err := catalog.Builtin()
	if err != nil {
		return nil, err
	}
	fetch := func(_ context.Context, ref content.Ref) ([]byte, error) {
		if s, ok := r.Sources[ref]; ok {
			return s, nil
		}
		return nil, fmt.Errorf("blob %s was not handed to the shard's executor", ref.Short())
	}
	p, err := compileBundle(ctx, &b, builtin, fetch, r.CacheDir, partition, nil)
	if err != nil {
		return nil, err
	}
	if p.ID != r.Job {
		return nil, fmt.Errorf("bundle compiles to job %s, not %s", p.ID.Short(), r.Job.Short())
	}
	p.CapMemory(r.MemoryBytes)
	return p, nil
}

// ExecuteIndex runs shard i of the plan, refusing an index it does not have.
func (p *Plan) ExecuteIndex(ctx context.Context, i int) (*Result, error) {
	if i < 0 || i >= len(p.Shards) {
		return nil, fmt.Errorf("job %s has no shard %d", p.ID.Short(), i)
	}
	return p.Execute(ctx, p.Shards[i])
}

// ExecuteHanded runs a shard handed whole to a plan from CompileRunner,
// after checking that it is this job's shard: its ID must be the hash of
// the job, its index and its parameters, as the partition made it.
func (p *Plan) ExecuteHanded(ctx context.Context, sh Shard) (*Result, error) {
	id, err := content.HashOf(canonicalShard{p.ID, sh.Index, sh.Params})
	if err != nil {
		return nil, fmt.Errorf("job: encoding shard %d: %w", sh.Index, err)
	}
	if sh.Index < 0 || id != sh.ID {
		return nil, fmt.Errorf("job %s: the shard handed as %d (%s) is not one of its shards", p.ID.Short(), sh.Index, sh.ID.Short())
	}
	return p.Execute(ctx, sh)
}
