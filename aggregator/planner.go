package aggregator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/trust"
)

// planner compiles bundles on the aggregator: the shards and their prices
// are derived here from the content itself, never taken from the submitter.
// Compiled plans are cached by bundle ref for the reducer peer.
type planner struct {
	blobs    *blob.Store
	builtin  *catalog.Catalog
	cacheDir string
	// fetchBlob reads a blob from this node, or from another aggregator.
	fetchBlob func(ctx context.Context, ref content.Ref) ([]byte, error)
	// durable stores a blob on a second aggregator, so a new leader can
	// plan and reduce the job after this node is gone.
	durable func(ctx context.Context, ref content.Ref) error

	mu    sync.Mutex
	plans map[content.Ref]*job.Plan
}

func (p *planner) fetch(ctx context.Context, ref content.Ref) ([]byte, error) {
	b, err := p.fetchBlob(ctx, ref)
	if err != nil {
		return nil, diag.New(diag.BlobMissing, ref.Short(), "blob %s is not on this aggregator: %v", ref, err).
			WithHelp("upload the bundle's content and inputs before submitting (scellis job submit does this)")
	}
	return b, nil
}

// compile returns the plan of a bundle, compiling it once.
func (p *planner) compile(ctx context.Context, bundleRef content.Ref) (*job.Plan, error) {
	p.mu.Lock()
	if pl, ok := p.plans[bundleRef]; ok {
		p.mu.Unlock()
		return pl, nil
	}
	p.mu.Unlock()
	raw, err := p.fetch(ctx, bundleRef)
	if err != nil {
		return nil, err
	}
	var b job.Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, diag.New(diag.PoolBadJob, bundleRef.Short(), "not a job bundle: %v", err)
	}
	if !content.IsRef(string(bundleRef)) {
		return nil, diag.New(diag.PoolBadRequest, "bundle", "the bundle ref is not sha256:<64 lowercase hex digits>")
	}
	dir := filepath.Join(p.cacheDir, bundleRef.Hex()[:16])
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	pl, err := job.CompileBundle(ctx, &b, p.builtin, p.fetch, dir)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.plans[bundleRef] = pl
	p.mu.Unlock()
	return pl, nil
}

// Plan implements api.Planner.
func (p *planner) Plan(ctx context.Context, bundleRef content.Ref, submitter string) (coordinator.SubmitJob, error) {
	pl, err := p.compile(ctx, bundleRef)
	if err != nil {
		return coordinator.SubmitJob{}, err
	}
	// The bundle and every blob it names must survive this node.
	refs := []content.Ref{bundleRef}
	for _, c := range pl.Content {
		if _, builtin := p.builtin.Lookup(string(c.Ref)); !builtin {
			refs = append(refs, c.Ref)
		}
	}
	for _, in := range pl.Inputs {
		refs = append(refs, in.Ref)
	}
	for _, ref := range refs {
		if err := p.durable(ctx, ref); err != nil {
			return coordinator.SubmitJob{}, err
		}
	}
	basis := "flat: 1 work unit per shard"
	if pl.Program.HasFunc("cost") {
		basis = fmt.Sprintf("cost() of program %s (%s)", pl.Program.Name, pl.Program.Ref.Short())
	}
	req := pl.AdmissionRequest()
	cmd := coordinator.SubmitJob{
		Job:              pl.ID,
		Name:             pl.Spec.Name,
		Bundle:           bundleRef,
		Submitter:        submitter,
		Regime:           pl.Spec.Regime,
		SecurityCritical: pl.Spec.SecurityCritical,
		Inputs:           req.Inputs,
		Models:           req.Models,
		Policy:           coordinator.Policy{Replicas: pl.Spec.Verification.Replicas, Attempts: pl.Spec.Verification.Attempts},
	}
	if cmd.Inputs == nil {
		cmd.Inputs = []trust.Item{}
	}
	for _, sh := range pl.Shards {
		cmd.Shards = append(cmd.Shards, coordinator.ShardPlan{Index: sh.Index, ID: sh.ID, Price: sh.Cost, PriceBasis: basis})
	}
	return cmd, nil
}
