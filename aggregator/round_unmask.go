package aggregator

import "context"

// unmask reads the sum the host unmasked (or decrypted): the summed
// update and metrics, and who contributed to them. A recorded round's
// cross-check starts here, so that a peer recomputes the round while this
// node runs its own server step (crosscheck.go).
func (rr *roundRun) unmask(ctx context.Context) error {
	rr.n.metrics.survivors.Observe(float64(len(rr.sum.Contributors)))
	rr.n.metrics.dropped.Add(float64(len(rr.sum.Dropped)))
	rr.update, rr.metrics = rr.bundle.Unpack(rr.sum.Sum)
	if rr.transcript != nil {
		rr.check = rr.startCrossCheck(ctx)
	}
	return nil
}
