package pool

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Deliver hands a result to the pool by commit–reveal (law 13): it commits
// to the result's hash under a fresh random nonce, uploads the bytes, and
// reveals the hash and nonce once the shard's reveal is open (the other
// replicas have committed, or the window of one lease TTL has passed),
// keeping the lease alive meanwhile. Early reveals are answered by the
// aggregator without a log entry; Deliver retries them every Poll. With
// NoCommit, or for a job of one replica, it reports the hash outright.
func (w *Worker) Deliver(ctx context.Context, g coordinator.LeaseGrant, data []byte, hash content.Ref) (coordinator.ReportResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := api.ResultReport{Job: g.Job, Shard: g.Shard, Result: hash}
	pol, known := w.policyOf(rctx, g.Job)
	if w.Identity != nil {
		// The signature binds the result to this peer, the shard and the
		// job's tier; the receipt keeps it (coordinator/signed.go). A
		// policy the pool could not tell is signed as replayable, the
		// tier of every job but a convergent one, which then refuses the
		// report (SC7305) and the shard is leased again.
		req.Sig = identity.Sign(w.Identity, identity.PurposeResult, coordinator.StatementOf(g.Job, g.Shard, hash, pol, w.Name).Bytes())
	}
	// A shard of a one-replica job is decided by its first report: there
	// is no second result to copy, and the pool takes the report outright.
	direct := w.NoCommit || (known && pol.Replicas == 1)
	if !direct {
		var nonce [coordinator.NonceBytes]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return coordinator.ReportResponse{}, err
		}
		if w.Name == "" {
			return coordinator.ReportResponse{}, fmt.Errorf("pool: a worker needs its member name to commit to results")
		}
		commit := coordinator.Commitment(hash, w.Name, g.Job, g.Shard, nonce[:])
		if _, err := w.Client.Commit(rctx, api.CommitRequest{Job: g.Job, Shard: g.Shard, Commitment: commit}); err != nil {
			return coordinator.ReportResponse{}, fmt.Errorf("committing: %w", err)
		}
		req.Nonce = fmt.Sprintf("%x", nonce)
	}
	if _, err := w.blobs().PutBlob(rctx, data); err != nil {
		return coordinator.ReportResponse{}, fmt.Errorf("uploading result: %w", err)
	}
	if direct {
		return w.report(rctx, req, data)
	}
	// Wait for the reveal with the lease renewed, so the shard is not
	// leased to a third peer while the second is still computing.
	wctx, stop := w.Renewing(ctx, g, 0)
	defer stop()
	poll := w.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	for {
		out, err := w.report(ctx, req, data)
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolRevealEarly {
			return out, err
		}
		select {
		case <-ctx.Done():
			return coordinator.ReportResponse{}, ctx.Err()
		case <-wctx.Done():
			// The lease is gone (revoked by a decision, or capped): the
			// reveal is open now, or will be at the window's end.
		case <-time.After(poll):
		}
	}
}

// report reports req. When the bytes went over a data channel to the
// member's data-plane aggregator but the node answering the report cannot
// find them on a majority (that aggregator is cut off from the others, or
// died after the upload), the result is uploaded again over HTTPS to the
// nodes that answer — the last fallback — and reported once more.
func (w *Worker) report(ctx context.Context, req api.ResultReport, data []byte) (coordinator.ReportResponse, error) {
	out, err := w.Client.Report(ctx, req)
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.BlobMissing || w.Blobs == nil {
		return out, err
	}
	w.logf("shard %d of %s: the result uploaded over the data plane is not durable yet; uploading it over https", req.Shard, req.Job.Short())
	if nd, ok := w.Blobs.(interface{ NotDurable() }); ok {
		nd.NotDurable() // later blobs skip the cut-off path for a while
	}
	if _, perr := w.Client.PutBlob(ctx, data); perr != nil {
		return out, err
	}
	return w.Client.Report(ctx, req)
}

// setPolicy remembers a job's verification policy.
func (w *Worker) setPolicy(job content.Ref, p coordinator.Policy) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.policies == nil {
		w.policies = map[content.Ref]coordinator.Policy{}
	}
	w.policies[job] = p
}

// policyOf returns job's verification policy (how many agreeing peers its
// shards need, its tier), asking the pool once per job; false when it
// cannot tell (then Deliver commits, and cannot sign).
func (w *Worker) policyOf(ctx context.Context, job content.Ref) (coordinator.Policy, bool) {
	w.mu.Lock()
	p, ok := w.policies[job]
	w.mu.Unlock()
	if ok {
		return p, true
	}
	st, err := w.Client.Job(ctx, job)
	if err != nil {
		return coordinator.Policy{}, false
	}
	w.setPolicy(job, st.Policy)
	return st.Policy, true
}
