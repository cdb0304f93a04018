package pool

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// courier carries a worker's concurrent commits (or reports) to the pool
// in batched requests, group-commit style: a call made while no request is
// in flight goes at once, alone; calls made while one is in flight queue
// and leave together, up to max per request, as soon as it returns. A
// lone shard therefore pays one request, and many shards finishing
// together share one request and one log entry.
type courier[Req, Resp any] struct {
	send func(ctx context.Context, reqs []Req) ([]Resp, error)
	max  int
	// size and maxBytes, when set, also bound the bytes of one request
	// (a request that alone exceeds maxBytes still goes, alone).
	size     func(Req) int
	maxBytes int

	mu    sync.Mutex
	queue []*parcel[Req, Resp]
	busy  bool // a goroutine is sending
}

type parcel[Req, Resp any] struct {
	req  Req
	done chan parcelOutcome[Resp] // buffered: the sender never blocks
}

type parcelOutcome[Resp any] struct {
	item Resp
	err  error
}

// call sends req in the next batch and returns its item of the answer. A
// transport error fails every item of the request (each is idempotent:
// the caller retries as after a single request).
func (c *courier[Req, Resp]) call(ctx context.Context, req Req) (Resp, error) {
	p := &parcel[Req, Resp]{req: req, done: make(chan parcelOutcome[Resp], 1)}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if !c.busy {
		c.busy = true
		go c.run()
	}
	c.mu.Unlock()
	select {
	case o := <-p.done:
		return o.item, o.err
	case <-ctx.Done():
		var zero Resp
		return zero, ctx.Err()
	}
}

// itemOf turns a batch item into what the single endpoint's call returns:
// its response, or its refusal as a diag.List error.
func itemOf(it api.BatchItem, err error) (json.RawMessage, error) {
	if err != nil {
		return nil, err
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	return it.Response, nil
}

// run sends the queue, batch after batch, until it is empty.
func (c *courier[Req, Resp]) run() {
	for {
		c.mu.Lock()
		n := min(len(c.queue), max(c.max, 1))
		if n == 0 {
			c.busy = false
			c.mu.Unlock()
			return
		}
		if c.size != nil {
			bytes := c.size(c.queue[0].req)
			for i := 1; i < n; i++ {
				if bytes += c.size(c.queue[i].req); bytes > c.maxBytes {
					n = i
					break
				}
			}
		}
		batch := c.queue[:n:n]
		c.queue = c.queue[n:]
		c.mu.Unlock()
		reqs := make([]Req, n)
		for i, p := range batch {
			reqs[i] = p.req
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		items, err := c.send(ctx, reqs)
		cancel()
		for i, p := range batch {
			if err != nil {
				p.done <- parcelOutcome[Resp]{err: err}
			} else {
				p.done <- parcelOutcome[Resp]{item: items[i]}
			}
		}
	}
}

// batching reports whether the worker sends commits and reports in
// batches (Batch > 1, or adaptive).
func (w *Worker) batching() bool { return w.Batch > 1 || w.adaptive() }

// adaptive reports whether the worker chooses its batches itself (Batch
// 0): a generic worker; a silo (Dispatch, Lanes) keeps one request per
// shard.
func (w *Worker) adaptive() bool { return w.Batch == 0 && w.Dispatch == nil && len(w.Lanes) == 0 }

// couriers returns the worker's commit and report couriers, made once.
func (w *Worker) couriers() (*courier[api.CommitRequest, api.BatchItem], *courier[outgoing, api.BatchItem]) {
	w.makeCouriers()
	return w.commits, w.reports
}

func (w *Worker) makeCouriers() {
	w.courierOnce.Do(func() {
		n := min(w.Batch, api.MaxBatch)
		if w.adaptive() {
			n = maxAdaptiveDepth // what is ready, up to what can be held
		}
		w.commits = &courier[api.CommitRequest, api.BatchItem]{send: w.Client.CommitBatch, max: n}
		w.reports = &courier[outgoing, api.BatchItem]{send: w.sendReports, max: n}
		w.renewals = &courier[api.RenewRequest, api.BatchItem]{send: w.Client.RenewBatch, max: n}
		w.uploads = &courier[[]byte, content.Ref]{send: w.Client.PutBlobs, max: min(n, blob.MaxBatch),
			size: func(b []byte) int { return len(b) }, maxBytes: maxUploadBatch}
	})
}

// maxUploadBatch bounds the bytes of one batched upload, far below any
// sensible blob size limit of the aggregators; larger results go alone.
const maxUploadBatch = 4 << 20

// smallResult is the size up to which a batching worker uploads a result
// in a batched HTTPS request even when it has a data channel: a data
// channel pays off for tensors, while hundreds of small results a second
// each sent as their own message cost more than one request carrying
// them all (and a burst of them can overrun a UDP socket's buffer, which
// SCTP then recovers from in retransmission timeouts of seconds).
const smallResult = 4 << 10

// putResult uploads a result's bytes: in a batched upload (POST
// /blobs/batch) when the worker batches and the result is small, else
// alone (the data plane, or PUT); https reports which way it went. A
// batched upload that fails is retried alone, so an aggregator that
// refuses the batch (too large for its limit) still gets the result.
func (w *Worker) putResult(ctx context.Context, data []byte) (ref content.Ref, https bool, err error) {
	limit := smallResult
	if w.Blobs == nil {
		limit = maxUploadBatch / 4 // HTTPS either way: batch what fits
	}
	if !w.batching() || len(data) > limit {
		ref, err := w.blobs().PutBlob(ctx, data)
		return ref, w.Blobs == nil, err
	}
	w.makeCouriers()
	ref, err = w.uploads.call(ctx, data)
	if err == nil || ctx.Err() != nil {
		return ref, true, err
	}
	ref, err = w.Client.PutBlob(ctx, data)
	return ref, true, err
}

// commitOne commits to one result, in a batch when the worker batches.
func (w *Worker) commitOne(ctx context.Context, req api.CommitRequest) (coordinator.CommitResponse, error) {
	if !w.batching() {
		return w.Client.Commit(ctx, req)
	}
	commits, _ := w.couriers()
	var out coordinator.CommitResponse
	raw, err := itemOf(commits.call(ctx, req))
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("commit answer: %w", err)
	}
	return out, nil
}

// outgoing is a report on its way: req, and the statement the courier
// signs for it (nil: req goes as it is, signed already or unsigned).
type outgoing struct {
	req api.ResultReport
	st  *receipt.Statement
}

// reportOne reports one result, in a batch when the worker batches.
func (w *Worker) reportOne(ctx context.Context, rep outgoing) (coordinator.ReportResponse, error) {
	if !w.batching() {
		if rep.st != nil {
			rep.req.Sig = identity.Sign(w.Identity, identity.PurposeResult, rep.st.Bytes())
		}
		return w.Client.Report(ctx, rep.req)
	}
	_, reports := w.couriers()
	var out coordinator.ReportResponse
	raw, err := itemOf(reports.call(ctx, rep))
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("report answer: %w", err)
	}
	return out, nil
}

// renewOne renews one lease, in a batch when the worker batches: a
// batching worker holds many leases at once, and their renewals would
// otherwise be most of its requests.
func (w *Worker) renewOne(ctx context.Context, req api.RenewRequest) error {
	if !w.batching() {
		_, err := w.Client.Renew(ctx, req)
		return err
	}
	w.makeCouriers()
	_, err := itemOf(w.renewals.call(ctx, req))
	return err
}

// sendReports sends one batched request of reports, signing the ones that
// wait for a signature with one signature between them: of the Merkle
// root of their statements, each report carrying its path to the root
// (receipt/batch.go), so that each receipt still verifies on its own. A
// lone report is signed alone, as a single report is. One signature a
// request instead of one a shard: on a busy worker, a request carries
// tens of reports.
func (w *Worker) sendReports(ctx context.Context, reps []outgoing) ([]api.BatchItem, error) {
	reqs := make([]api.ResultReport, len(reps))
	var leaves [][sha256.Size]byte
	var unsigned []int
	for i, r := range reps {
		reqs[i] = r.req
		if r.st != nil {
			unsigned = append(unsigned, i)
			leaves = append(leaves, receipt.StatementLeaf(*r.st))
		}
	}
	switch len(unsigned) {
	case 0:
	case 1:
		reqs[unsigned[0]].Sig = identity.Sign(w.Identity, identity.PurposeResult, reps[unsigned[0]].st.Bytes())
	default:
		root, paths := receipt.BatchTree(leaves)
		sig := identity.Sign(w.Identity, identity.PurposeResultBatch, root[:])
		for k, i := range unsigned {
			reqs[i].Sig, reqs[i].Path = sig, paths[k]
		}
	}
	return w.Client.ReportBatch(ctx, reqs)
}
