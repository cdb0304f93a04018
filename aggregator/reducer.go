package aggregator

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/job"
)

// reduceJob is the reducer peer's work for one decided job: fetch every
// verified result by its canonical hash, reduce in shard-index order with the
// job's reducer content, and store result.json as a blob. Unverified shards
// are left out of the reduction and listed in the document, never counted.
func (n *Node) reduceJob(ctx context.Context, id content.Ref) (content.Ref, error) {
	st, err := n.fsm.machine().Job(id)
	if err != nil {
		return "", err
	}
	pl, err := n.planner.compile(ctx, st.Bundle)
	if err != nil {
		return "", err
	}
	if pl.ID != id {
		return "", fmt.Errorf("bundle %s compiles to job %s, not %s", st.Bundle.Short(), pl.ID.Short(), id.Short())
	}
	var results []*job.Result
	var unverified []int
	for _, s := range st.Shards {
		if s.State != coordinator.StateVerified {
			unverified = append(unverified, s.Index)
			continue
		}
		b, err := n.fetchBlob(ctx, s.Result)
		if err != nil {
			return "", fmt.Errorf("shard %d: result %s: %w", s.Index, s.Result.Short(), err)
		}
		r, err := job.DecodeResult(pl.Shards[s.Index], b)
		if err != nil {
			return "", err
		}
		results = append(results, r)
	}
	reduced, err := pl.Reduce(ctx, results)
	if err != nil {
		return "", err
	}
	doc := job.NewDocument(pl, results, reduced, st.Method, unverified)
	for _, r := range n.fsm.machine().Receipts(0) {
		if r.Job == id {
			if doc.Extra == nil {
				doc.Extra = &job.DocExtension{}
			}
			doc.Extra.Receipts = append(doc.Extra.Receipts, r.Hash)
		}
	}
	b, err := doc.Marshal()
	if err != nil {
		return "", err
	}
	return n.blobs.PutBytes(b)
}
