package job

import (
	"context"
	"fmt"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/script"
)

// Result is one shard's output: the plain value, its canonical bytes and
// their hash. Peers compare and the coordinator stores only the hash.
type Result struct {
	Index int
	Shard content.Ref
	Value any
	Bytes []byte
	Hash  content.Ref
}

// Execute runs the program on one shard in the sandbox. The content's
// randomness is seeded from the shard ID, so the result is a function of the
// shard alone (replayable tier).
func (p *Plan) Execute(ctx context.Context, sh Shard) (*Result, error) {
	inputs := make(map[string]any, len(p.Inputs))
	for _, in := range p.Inputs {
		inputs[in.Name] = in.Data
	}
	v, err := script.Call(ctx, p.env(sh.ID.Digest()), p.Program, "run", p.shardParams(sh), inputs)
	if err != nil {
		return nil, fmt.Errorf("shard %d: %w", sh.Index, err)
	}
	return NewResult(sh, v)
}

// NewResult encodes a shard's value canonically and hashes it. Value is
// the decoded canonical form, exactly what a remote reducer gets from the
// bytes, so a solo run and a pool reduce the same values.
func NewResult(sh Shard, v any) (*Result, error) {
	b, err := content.Encode(v)
	if err != nil {
		return nil, diag.New(diag.ContentShape, fmt.Sprintf("shard %d", sh.Index), "result cannot be encoded: %v", err)
	}
	return DecodeResult(sh, b)
}

// DecodeResult rebuilds a Result from canonical bytes (fetched by hash).
func DecodeResult(sh Shard, b []byte) (*Result, error) {
	var v any
	if err := content.Decode(b, &v); err != nil {
		return nil, diag.New(diag.ContentShape, fmt.Sprintf("shard %d", sh.Index), "result bytes do not decode: %v", err)
	}
	return &Result{Index: sh.Index, Shard: sh.ID, Value: v, Bytes: b, Hash: content.Hash(b)}, nil
}

// Reduce combines results with the job's reducer in shard-index order,
// whatever order they arrived in.
func (p *Plan) Reduce(ctx context.Context, results []*Result) (any, error) {
	sorted := append([]*Result(nil), results...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	rows := make([]any, len(sorted))
	for i, r := range sorted {
		rows[i] = map[string]any{"index": int64(r.Index), "params": p.Shards[r.Index].Params, "value": r.Value}
	}
	v, err := script.Call(ctx, p.env(p.ID.Digest()), p.Reducer, "reduce", rows, p.Spec.Reducer.Params)
	if err != nil {
		return nil, fmt.Errorf("reduce: %w", err)
	}
	return v, nil
}
