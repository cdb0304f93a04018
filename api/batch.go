package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
)

// Batched commits and reports: a worker that has run several shards sends
// their commitments, and later their reveals, in one request each, and
// the server proposes them as one coordinator.Batch — one log entry, one
// consensus round and one fsync for all of them, each receipt minted as
// its shard is decided. Each item is decided on its own, exactly as the
// single-shard endpoints (POST /v1/commits, POST /v1/results) decide it:
// the same checks, the same refusals, the same commit–reveal order and
// signatures; a refused item leaves the others standing. The single-shard
// endpoints stay as they were.

// MaxBatch bounds the items of one batched request.
const MaxBatch = 256

// MaxBatchRequestBytes bounds a batched request body: MaxBatch items of
// hashes, nonces, signatures and batch paths, never result bytes (law 3);
// a full batch of reports is ~180 KiB (TestFullSignedReportBatchFits).
const MaxBatchRequestBytes = 256 << 10

// CommitBatch commits the caller to the results of several shards.
type CommitBatch struct {
	Commits []CommitRequest `json:"commits"`
}

// RenewBatch renews several of the caller's leases.
type RenewBatch struct {
	Renewals []RenewRequest `json:"renewals"`
}

// ReportBatch reveals the results of several shards (their bytes went to
// the blob store, as for ResultReport).
type ReportBatch struct {
	Reports []ResultReport `json:"reports"`
}

// BatchItem is the outcome of one item of a batched request: the
// response the single-shard endpoint would give (a
// coordinator.CommitResponse or coordinator.ReportResponse), or the
// diagnostics that refused it.
type BatchItem struct {
	Response json.RawMessage `json:"response,omitempty"`
	Refusal  diag.List       `json:"refusal,omitempty"`
}

// Err returns the item's refusal as an error (a diag.List), or nil.
func (it BatchItem) Err() error {
	if len(it.Refusal) == 0 {
		return nil
	}
	return it.Refusal
}

// BatchResponse answers a batched request: one item per request item, in
// order.
type BatchResponse struct {
	Results []BatchItem `json:"results"`
}

// bodyLimit is how many bytes a request body to e may have.
func bodyLimit(e Endpoint) int64 {
	switch e.String() {
	case "POST /v1/commits/batch", "POST /v1/results/batch", "POST /v1/renew/batch":
		return MaxBatchRequestBytes
	}
	return MaxRequestBytes
}

// checkBatch refuses an empty or oversized batch.
func checkBatch(what string, n int) *diag.Diagnostic {
	if n == 0 || n > MaxBatch {
		return diag.New(diag.PoolBadRequest, what, "a batch holds %d items; it must hold 1 to %d", n, MaxBatch).
			WithHelp("send at most %d items per request, or use the single-shard endpoint", MaxBatch)
	}
	return nil
}

func itemSubject(what string, i int, job content.Ref, shard int) string {
	return fmt.Sprintf("%s[%d] (job %s shard %d)", what, i, job.Short(), shard)
}

// named returns copies of ds whose subject names the batch item.
func named(ds diag.List, subject string) diag.List {
	out := make(diag.List, len(ds))
	for i, d := range ds {
		c := *d
		c.Subject = subject
		out[i] = &c
	}
	return out
}

func refusedItem(d *diag.Diagnostic) BatchItem { return BatchItem{Refusal: diag.List{d}} }

// decodeItems reads a batch body {"<what>": [item, …]} into items,
// checking the count first and then each item on its own, so a malformed
// item (a bad ref, an unknown field) is refused naming it.
//
// A well-formed body — every batch a worker sends — is decoded in one
// pass, by the same rules (unknown fields and trailing data refused);
// only a body that fails it is read again item by item, for the
// diagnostic that names the item (decodeItemsByItem).
func decodeItems[T any](w http.ResponseWriter, r *http.Request, what string, items *[]T) bool {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		status := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		writeDiag(w, status, diag.New(diag.PoolBadRequest, r.URL.Path, "malformed request body: %v", err).WithHelp("%s", decodeHelp))
		return false
	}
	if list, ok := decodeBatch[T](body, what); ok {
		if d := checkBatch(what, len(list)); d != nil {
			writeDiag(w, http.StatusBadRequest, d)
			return false
		}
		*items = list
		return true
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return decodeItemsByItem(w, r, what, items)
}

// decodeBatch decodes body as {"<what>": [T, …]} and nothing else (no
// other key, no unknown field in an item, no trailing data); ok is false
// for any other body.
func decodeBatch[T any](body []byte, what string) (list []T, ok bool) {
	var m map[string][]T
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	list, found := m[what]
	if len(m) != 1 || !found {
		return nil, false
	}
	return list, true
}

// decodeItemsByItem is decodeItems for a body the one pass refused: it
// reads the items as raw values, then each on its own, so the refusal
// names the first malformed item.
func decodeItemsByItem[T any](w http.ResponseWriter, r *http.Request, what string, items *[]T) bool {
	var raw map[string][]json.RawMessage
	if !decode(w, r, &raw) {
		return false
	}
	list, ok := raw[what]
	if len(raw) != 1 || !ok {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, r.URL.Path, "the body must be {%q: [...]} and nothing else", what))
		return false
	}
	if d := checkBatch(what, len(list)); d != nil {
		writeDiag(w, http.StatusBadRequest, d)
		return false
	}
	*items = make([]T, len(list))
	for i, b := range list {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&(*items)[i]); err != nil {
			writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, fmt.Sprintf("%s[%d]", what, i), "malformed item %d of the batch: %v", i, err).
				WithHelp("every item is a single-shard request body; the batch was not applied"))
			return false
		}
	}
	return true
}

func (s *Server) commitBatch(w http.ResponseWriter, r *http.Request) {
	var req CommitBatch
	if !decodeItems(w, r, "commits", &req.Commits) {
		return
	}
	peer := peerOf(r).Name
	now := s.now()
	out := make([]BatchItem, len(req.Commits))
	var cmds []coordinator.Command
	var at []int // the request item of each command
	for i, c := range req.Commits {
		if !content.IsRef(string(c.Commitment)) {
			out[i] = refusedItem(diag.New(diag.PoolBadRequest, itemSubject("commits", i, c.Job, c.Shard), "commitment %.80q is not a ref", c.Commitment).
				WithHelp("send coordinator.Commitment(result, your member name, job, shard, nonce)"))
			continue
		}
		cmds = append(cmds, coordinator.CommitResult{Peer: peer, Job: c.Job, Shard: c.Shard, Commitment: c.Commitment, Now: now})
		at = append(at, i)
	}
	s.applyBatch(w, r, cmds, at, out)
}

func (s *Server) renewBatch(w http.ResponseWriter, r *http.Request) {
	var req RenewBatch
	if !decodeItems(w, r, "renewals", &req.Renewals) {
		return
	}
	peer := peerOf(r).Name
	now := s.now()
	cmds := make([]coordinator.Command, len(req.Renewals))
	at := make([]int, len(req.Renewals))
	for i, it := range req.Renewals {
		cmds[i] = coordinator.RenewLease{Peer: peer, Job: it.Job, Shard: it.Shard, Now: now}
		at[i] = i
	}
	s.applyBatch(w, r, cmds, at, make([]BatchItem, len(cmds)))
}

func (s *Server) reportBatch(w http.ResponseWriter, r *http.Request) {
	var req ReportBatch
	if !decodeItems(w, r, "reports", &req.Reports) {
		return
	}
	now := s.now()
	out := make([]BatchItem, len(req.Reports))
	var ok []int // items that passed the checks made before any log entry
	for i, it := range req.Reports {
		if ds, _ := s.reportRefusal(it, itemSubject("reports", i, it.Job, it.Shard), now); ds != nil {
			out[i] = BatchItem{Refusal: named(ds, itemSubject("reports", i, it.Job, it.Shard))}
			continue
		}
		ok = append(ok, i)
	}
	// Every result's bytes must be durable before its hash is proposed,
	// as for a single report; the checks run side by side.
	if (s.Durable != nil || s.DurableAll != nil) && len(ok) > 0 {
		var errs []error
		if s.DurableAll != nil {
			refs := make([]content.Ref, len(ok))
			for k, i := range ok {
				refs[k] = req.Reports[i].Result
			}
			errs = s.DurableAll(r.Context(), refs)
		} else {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			errs = make([]error, len(ok))
			for k, i := range ok {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					errs[k] = s.Durable(r.Context(), req.Reports[i].Result)
				}()
			}
			wg.Wait()
		}
		kept := ok[:0]
		for k, i := range ok {
			if errs[k] != nil {
				it := req.Reports[i]
				out[i] = refusedItem(diag.New(diag.BlobMissing, it.Result.Short(), "%s: the result is not stored durably yet: %v",
					itemSubject("reports", i, it.Job, it.Shard), errs[k]).WithHelp("upload the result blob, then report again"))
				continue
			}
			kept = append(kept, i)
		}
		ok = kept
	}
	peer := peerOf(r)
	key := peer.PublicKey.String()
	now = s.now()
	cmds := make([]coordinator.Command, len(ok))
	for k, i := range ok {
		it := req.Reports[i]
		cmds[k] = coordinator.ReportResult{Peer: peer.Name, Job: it.Job, Shard: it.Shard, Result: it.Result, Nonce: it.Nonce, Key: key, Sig: it.Sig, Path: it.Path, Cite: it.Cite, Now: now}
	}
	s.applyBatch(w, r, cmds, ok, out)
}

// applyBatch proposes cmds as one coordinator.Batch and writes the batch's
// answer: out, with the outcome of cmds[k] at out[at[k]]. Items refused
// before (out already set) keep their refusal.
func (s *Server) applyBatch(w http.ResponseWriter, r *http.Request, cmds []coordinator.Command, at []int, out []BatchItem) {
	if len(cmds) > 0 {
		res, err := s.Apply.Apply(r.Context(), coordinator.Batch{Commands: cmds})
		if err != nil || len(res.Refusal) > 0 {
			// Not leader, no quorum, or the batch itself refused: the
			// single endpoints' answer, for the whole request.
			s.writeApplied(w, r, res, err)
			return
		}
		if len(at) == len(out) && inOrder(at) {
			// Every item became a command, in order: the batch's answer
			// is already the response body (coordinator.BatchResponse
			// and BatchResponse encode alike), as a single endpoint's
			// is (writeApplied); not decoded and encoded again.
			s.writeApplied(w, r, res, nil)
			return
		}
		var br BatchResponse
		if err := json.Unmarshal(res.Response, &br); err != nil || len(br.Results) != len(cmds) {
			s.logError("batch", fmt.Errorf("a batch of %d commands answered %d results (%v)", len(cmds), len(br.Results), err))
			writeDiag(w, http.StatusInternalServerError, diag.New(diag.PoolBadCommand, r.URL.Path, "the batch's answer could not be read"))
			return
		}
		for k, i := range at {
			out[i] = br.Results[k]
		}
	}
	writeJSON(w, http.StatusOK, BatchResponse{Results: out})
}

// inOrder reports whether at is 0, 1, …, len(at)-1.
func inOrder(at []int) bool {
	for k, i := range at {
		if i != k {
			return false
		}
	}
	return true
}

// CommitBatch commits the caller to several results in one request; the
// answer has one item per commitment, in order.
func (c *Client) CommitBatch(ctx context.Context, reqs []CommitRequest) ([]BatchItem, error) {
	var r BatchResponse
	if err := c.do(ctx, "POST", "/v1/commits/batch", CommitBatch{Commits: reqs}, &r); err != nil {
		return nil, err
	}
	return r.Results, checkItems(len(reqs), r.Results)
}

// RenewBatch renews several leases in one request; the answer has one
// item per lease, in order (a coordinator.RenewResponse, or SC7009 when
// the lease is gone).
func (c *Client) RenewBatch(ctx context.Context, reqs []RenewRequest) ([]BatchItem, error) {
	var r BatchResponse
	if err := c.do(ctx, "POST", "/v1/renew/batch", RenewBatch{Renewals: reqs}, &r); err != nil {
		return nil, err
	}
	return r.Results, checkItems(len(reqs), r.Results)
}

// ReportBatch reports several results in one request; the answer has one
// item per report, in order.
func (c *Client) ReportBatch(ctx context.Context, reqs []ResultReport) ([]BatchItem, error) {
	var r BatchResponse
	if err := c.do(ctx, "POST", "/v1/results/batch", ReportBatch{Reports: reqs}, &r); err != nil {
		return nil, err
	}
	return r.Results, checkItems(len(reqs), r.Results)
}

func checkItems(want int, got []BatchItem) error {
	if len(got) != want {
		return fmt.Errorf("api: a batch of %d items was answered with %d", want, len(got))
	}
	return nil
}
