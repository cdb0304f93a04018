package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"
)

// courier carries a worker's concurrent commits (or reports) to the pool
// in batched requests, group-commit style: a call made while no request is
// in flight goes at once, alone; calls made while one is in flight queue
// and leave together, up to max per request, as soon as it returns. A
// lone shard therefore pays one request, and many shards finishing
// together share one request and one log entry.
type courier[Req any] struct {
	send func(ctx context.Context, reqs []Req) ([]api.BatchItem, error)
	max  int

	mu    sync.Mutex
	queue []*parcel[Req]
	busy  bool // a goroutine is sending
}

type parcel[Req any] struct {
	req  Req
	done chan parcelOutcome // buffered: the sender never blocks
}

type parcelOutcome struct {
	item api.BatchItem
	err  error
}

// call sends req in the next batch and returns its item's outcome: the
// item's refusal as a diag.List error, or its response. A transport error
// fails every item of the request (each is idempotent: the caller retries
// as after a single request).
func (c *courier[Req]) call(ctx context.Context, req Req) (json.RawMessage, error) {
	p := &parcel[Req]{req: req, done: make(chan parcelOutcome, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if !c.busy {
		c.busy = true
		go c.run()
	}
	c.mu.Unlock()
	select {
	case o := <-p.done:
		if o.err != nil {
			return nil, o.err
		}
		if err := o.item.Err(); err != nil {
			return nil, err
		}
		return o.item.Response, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run sends the queue, batch after batch, until it is empty.
func (c *courier[Req]) run() {
	for {
		c.mu.Lock()
		n := min(len(c.queue), max(c.max, 1))
		if n == 0 {
			c.busy = false
			c.mu.Unlock()
			return
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
				p.done <- parcelOutcome{err: err}
			} else {
				p.done <- parcelOutcome{item: items[i]}
			}
		}
	}
}

// batching reports whether the worker sends commits and reports in
// batches (Batch > 1).
func (w *Worker) batching() bool { return w.Batch > 1 }

// couriers returns the worker's commit and report couriers, made once.
func (w *Worker) couriers() (*courier[api.CommitRequest], *courier[api.ResultReport]) {
	w.courierOnce.Do(func() {
		n := min(w.Batch, api.MaxBatch)
		w.commits = &courier[api.CommitRequest]{send: w.Client.CommitBatch, max: n}
		w.reports = &courier[api.ResultReport]{send: w.Client.ReportBatch, max: n}
	})
	return w.commits, w.reports
}

// commitOne commits to one result, in a batch when the worker batches.
func (w *Worker) commitOne(ctx context.Context, req api.CommitRequest) (coordinator.CommitResponse, error) {
	if !w.batching() {
		return w.Client.Commit(ctx, req)
	}
	commits, _ := w.couriers()
	var out coordinator.CommitResponse
	raw, err := commits.call(ctx, req)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("commit answer: %w", err)
	}
	return out, nil
}

// reportOne reports one result, in a batch when the worker batches.
func (w *Worker) reportOne(ctx context.Context, req api.ResultReport) (coordinator.ReportResponse, error) {
	if !w.batching() {
		return w.Client.Report(ctx, req)
	}
	_, reports := w.couriers()
	var out coordinator.ReportResponse
	raw, err := reports.call(ctx, req)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("report answer: %w", err)
	}
	return out, nil
}
