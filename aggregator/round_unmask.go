package aggregator

import "context"

// unmask reads the sum the host unmasked (or decrypted): the summed
// update and metrics, and who contributed to them.
func (rr *roundRun) unmask(context.Context) error {
	rr.n.metrics.survivors.Observe(float64(len(rr.sum.Contributors)))
	rr.n.metrics.dropped.Add(float64(len(rr.sum.Dropped)))
	rr.update, rr.metrics = rr.bundle.Unpack(rr.sum.Sum)
	return nil
}
