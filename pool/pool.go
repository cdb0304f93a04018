// Package pool executes a compiled job's shards. Local is the pool of one:
// every shard runs in this process on all cores, with no coordinator and no
// network, and results are reduced in shard-index order (law 4: a pool of one
// needs nothing). Remote pools (lease → run → submit) build on the same
// job.Plan and job.Result types.
package pool

import (
	"context"

	"github.com/scellis/scellis/job"
)

// Event reports progress of a run: a shard finished (Done of Total).
type Event struct {
	Done, Total int
	Shard       int
	// Result is the shard's result (nil if it failed); a live view draws
	// it as it lands.
	Result *job.Result
}

// Outcome is what a pool run produced: one verified result per shard (in
// index order), the shards that could not be verified, and the reduction.
type Outcome struct {
	Results    []*job.Result
	Unverified []int
	Reduced    any
	Method     string
}

// Executor runs a plan to completion. Implementations must reduce in
// shard-index order and never count an unverified result as verified.
type Executor interface {
	Run(ctx context.Context, p *job.Plan) (*Outcome, error)
}
