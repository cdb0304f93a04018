package aggregator

import (
	"context"
	"fmt"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/trust"
)

// open stores the round's global model and bundle durably, opens its
// secure sum on this node (the round's host), and submits the round job:
// a shard per member silo, each leased to that silo alone.
func (rr *roundRun) open(ctx context.Context) error {
	n, st, r, spec := rr.n, rr.st, rr.r, rr.spec
	bb, err := content.Encode(&rr.bundle)
	if err != nil {
		return err
	}
	rr.bref = content.Hash(bb)
	// The global model of a round after the first is the model the
	// previous round stored durably (here and on a second aggregator)
	// before it was reduced: stored again, it was hashed, copied and, in a
	// cluster, sent to a peer once more for nothing — 8 MB at d = 10^6
	// (issue 19). Only the bundle is new then.
	stored := [][]byte{rr.gb, bb}
	if rr.gref == rr.prevModel && n.blobs.Has(rr.gref) {
		stored = stored[1:]
	}
	if err := n.storeDurableAll(ctx, stored...); err != nil {
		return err // transient: the next pass retries
	}
	jobID, err := roundJobID(rr.bref)
	if err != nil {
		return err
	}
	rr.recorded, rr.unchecked = n.recordRound(&rr.bundle)
	var fwd wire.Forwarder
	if checker, ok := n.checkerOf(); ok && rr.recorded {
		rr.checker, fwd = checker.Name, rr.forwarder(checker)
	}
	if err := n.openSum(&rr.bundle, rr.parentKey, rr.recorded, fwd); err != nil {
		return rr.retry("round %d: secure aggregation cannot open: %v", r, err)
	}
	rr.opened, rr.job = time.Now(), jobID
	ttl := n.opt.RoundLeaseTTL
	if ttl <= 0 {
		ttl = time.Hour
	}
	cmd := coordinator.SubmitJob{
		Job: jobID, Name: fmt.Sprintf("%s-round-%d", spec.Name, r), Bundle: rr.bref, Run: st.ID, Round: r,
		Inputs: []trust.Item{{Name: spec.Dataset, Class: trust.Confidential}},
		Policy: coordinator.Policy{Replicas: 1, LeaseTTL: ttl.Milliseconds()}, Now: time.Now().UnixMilli(),
	}
	for i, mem := range rr.members {
		s := mem.ID
		sid, err := content.HashOf(struct {
			Job  content.Ref `cbor:"job"`
			Silo string      `cbor:"silo"`
		}{jobID, s})
		if err != nil {
			return err
		}
		cmd.Shards = append(cmd.Shards, coordinator.ShardPlan{Index: i, ID: sid, Price: 1, PriceBasis: roundPriceBasis, Peer: s, Via: n.viaOf(s)})
	}
	res, err := n.Apply(ctx, cmd)
	if err != nil {
		n.abortSum(&rr.bundle, "its round job was not committed")
		return err // not the leader any more, or not committed: the next pass (or leader) retries
	}
	if len(res.Refusal) > 0 {
		n.abortSum(&rr.bundle, "its round job was refused")
		if stale(res.Refusal) {
			return errNextPass // planned from a view the run has left: the next pass re-reads it
		}
		// Admission refused the round (the pool's trust rules): a policy
		// that makes progress impossible.
		return rr.stop("round %d refused: %v", r, res.Refusal)
	}
	return nil
}
