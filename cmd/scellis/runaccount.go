package main

import (
	"context"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl/account"
)

// poolSource reads a run's account (package account) from the pool: job
// states and blobs over the API, as every CLI command that shows ε does.
type poolSource struct{ c *api.Client }

var _ account.Source = poolSource{}

func (p poolSource) Job(ctx context.Context, id content.Ref) (coordinator.JobStatus, error) {
	return p.c.Job(ctx, id)
}

func (p poolSource) Blob(ctx context.Context, ref content.Ref) ([]byte, error) {
	return p.c.GetBlob(ctx, ref)
}
