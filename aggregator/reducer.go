package aggregator

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/job"
)

// reduceRequest is what a reducing child is told: the job, its bundle,
// each shard's verified result (empty when unverified) and the receipts to
// list, all read from the local blob store.
type reduceRequest struct {
	Plan     planRequest   `cbor:"plan"`
	Job      content.Ref   `cbor:"job"`
	Method   string        `cbor:"method"`
	Results  []content.Ref `cbor:"results"` // by shard index; "" for unverified shards
	Receipts []content.Ref `cbor:"receipts"`
	// Methods says, by shard index, how each shard of an adaptive job was
	// accepted (spot-checked alone or audited, canary, re-checked).
	Methods []string `cbor:"methods,omitempty"`
	// Verifiers name, by shard index, the verifier peer whose verdict
	// accepted a checked shard ("" otherwise).
	Verifiers []string `cbor:"verifiers,omitempty"`
}

// reduceJob is the reducer peer's work for one decided job: fetch every
// verified result by its canonical hash, reduce in shard-index order with the
// job's reducer content, and store result.json as a blob. Unverified shards
// are left out of the reduction and listed in the document, never counted.
// The reducer is the submitter's content: it runs in a child process under
// the operator's caps (planner.inChild), like partition and cost.
func (n *Node) reduceJob(ctx context.Context, id content.Ref) (content.Ref, error) {
	st, err := n.fsm.machine().Job(id)
	if err != nil {
		return "", err
	}
	plan, sent, err := n.planner.request(ctx, st.Bundle)
	if err != nil {
		return "", err
	}
	req := reduceRequest{
		Plan: plan,
		Job:  id, Method: st.Method, Results: make([]content.Ref, len(st.Shards)),
		Receipts: n.fsm.machine().JobReceipts(id),
	}
	for _, s := range st.Shards {
		if s.State != coordinator.StateVerified {
			continue
		}
		// The child reads the local store only: bring the result here,
		// and hand it over when it is small.
		b, err := n.fetchBlob(ctx, s.Result)
		if err != nil {
			return "", fmt.Errorf("shard %d: result %s: %w", s.Index, s.Result.Short(), err)
		}
		sent.add(s.Result, b)
		req.Results[s.Index] = s.Result
		if st.Policy.Mode == coordinator.ModeAdaptive {
			if req.Methods == nil {
				req.Methods = make([]string, len(st.Shards))
			}
			req.Methods[s.Index] = s.Method
		}
		if k := len(s.Verdicts); k > 0 {
			if req.Verifiers == nil {
				req.Verifiers = make([]string, len(st.Shards))
			}
			req.Verifiers[s.Index] = s.Verdicts[k-1].Verifier
		}
	}
	doc, err := n.planner.inChild(ctx, reduceHandler, req)
	if err != nil {
		return "", err
	}
	return n.blobs.PutBytes(doc)
}

func childReduce(ctx context.Context, raw []byte) ([]byte, error) {
	req, pl, _, blobs, err := decodeCompiled[reduceRequest](ctx, raw)
	if err != nil {
		return nil, err
	}
	if pl.ID != req.Job {
		return nil, fmt.Errorf("bundle %s compiles to job %s, not %s", req.Plan.Bundle.Short(), pl.ID.Short(), req.Job.Short())
	}
	if len(req.Results) != len(pl.Shards) {
		return nil, fmt.Errorf("job %s has %d shards, the request lists %d", req.Job.Short(), len(pl.Shards), len(req.Results))
	}
	var results []*job.Result
	var unverified []int
	for i, ref := range req.Results {
		if ref == "" {
			unverified = append(unverified, i)
			continue
		}
		b, err := blobs.get(ref)
		if err != nil {
			return nil, fmt.Errorf("shard %d: result %s: %w", i, ref.Short(), err)
		}
		r, err := job.DecodeResult(pl.Shards[i], b)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	reduced, err := pl.Reduce(ctx, results)
	if err != nil {
		return nil, err
	}
	doc := job.NewDocument(pl, results, reduced, req.Method, unverified)
	for i, m := range req.Methods {
		if m == "" || i >= len(doc.Shards) {
			continue
		}
		if doc.Shards[i].Check == nil {
			doc.Shards[i].Check = &job.DocCheck{Tier: doc.Verification.Tier}
		}
		doc.Shards[i].Check.Method = m
	}
	for i, v := range req.Verifiers {
		if i < len(doc.Shards) && doc.Shards[i].Check != nil {
			doc.Shards[i].Check.Verifier = v
		}
	}
	if len(req.Receipts) > 0 {
		doc.Extra = &job.DocExtension{Receipts: req.Receipts}
	}
	return doc.Marshal()
}
