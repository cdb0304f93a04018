package aggregator

import (
	"context"
	"crypto/ecdh"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// The round's secure sum runs on the reducer peer's secure-aggregation
// host (secagg/wire) under one of its schemes: pairwise masking or, for a
// run with aggregation: threshold-he, threshold homomorphic encryption.
// The scheme changes only how the sum is formed; the round flow around it
// is the same.

// openSum opens the round's secure sum on this node's host; recorded
// keeps a masking round's transcript for its cross-check (crosscheck.go),
// forwarding its masked inputs with fwd (crosscheck_forward.go).
func (n *Node) openSum(b *fl.RoundBundle, parent *ecdh.PrivateKey, recorded bool, fwd wire.Forwarder) error {
	if b.SubCohorts != nil {
		cohorts := make([]secagg.Params, len(b.SubCohorts))
		for i, sc := range b.SubCohorts {
			cohorts[i] = sc.SecAgg
		}
		return n.sagg.OpenParent(b.SecAgg.Round, parent, cohorts)
	}
	if b.HE != nil {
		return n.sagg.OpenHE(b.HE.Params, n.opt.SecAgg)
	}
	if recorded {
		return n.sagg.OpenRecorded(b.SecAgg, n.siloRoundDeadlines(), fwd)
	}
	return n.sagg.Open(b.SecAgg, n.siloRoundDeadlines())
}

// siloRoundDeadlines are the deadlines of a masking round whose sites are
// silos: they advertise before they train (silo.keyExchange), so their
// training falls in the mask phase (wire.Deadlines.TrainInMask).
func (n *Node) siloRoundDeadlines() wire.Deadlines {
	dl := n.opt.SecAgg
	dl.TrainInMask = true
	return dl
}

func (n *Node) abortSum(b *fl.RoundBundle, reason string) {
	if b.SubCohorts != nil {
		n.sagg.AbortParent(b.SecAgg.Round, reason)
		return
	}
	n.sagg.Abort(b.SecAgg.Round, reason)
}

// waitSum waits for the round's sum, in masking's form either way.
// A hierarchical round's is the total of its sub-cohorts' partial sums
// (waitParent; job is its round job).
func (n *Node) waitSum(ctx context.Context, b *fl.RoundBundle, job content.Ref) (*secagg.Result, error) {
	if b.SubCohorts != nil {
		return n.waitParent(ctx, b, job)
	}
	if b.HE == nil {
		return n.sagg.Wait(ctx, b.SecAgg.Round)
	}
	res, err := n.sagg.WaitHE(ctx, b.SecAgg.Round)
	if err != nil {
		return nil, err
	}
	return b.HE.Result(res, b.SecAgg.Weighted), nil
}

// excuse tells the round's host that a silo will not take part.
func (n *Node) excuse(round, silo string) {
	n.sagg.Excuse(round, silo)
}
