package fl

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/secagg"
)

// RoundBundle is everything a silo needs for one round of a run. The
// aggregator stores it as a blob; its ref is the round job's Bundle, so the
// silo finds it from the job it leased. Everything in it is a hash or a
// parameter: the global model, the run spec and the strategy are blobs.
//
// The vector a silo secure-aggregates is its update (UpdateDim values)
// followed by its metrics in the order of Metrics (missing ones are 0), with
// its weight in secure aggregation's weight coordinate. The reducer splits
// the sum the same way.
type RoundBundle struct {
	Format    string        `cbor:"format" json:"format"`
	Run       content.Ref   `cbor:"run" json:"run"` // the canonical run spec blob
	Round     int           `cbor:"round" json:"round"`
	Strategy  content.Ref   `cbor:"strategy" json:"strategy"` // catalog entry ref
	Global    content.Ref   `cbor:"global" json:"global"`     // Global.Encode() blob
	UpdateDim int           `cbor:"update_dim" json:"update_dim"`
	Metrics   []string      `cbor:"metrics" json:"metrics"`
	SecAgg    secagg.Params `cbor:"secagg" json:"secagg"`
	Seed      int64         `cbor:"seed" json:"seed"`
}

// RoundFormat versions RoundBundle.
const RoundFormat = "scellis/round/v1"

// DefaultMetrics are the summable metrics every built-in strategy reports.
var DefaultMetrics = []string{"correct", "examples", "loss"}

// Pack lays an update and its metrics out as the secure-aggregation input.
func (b *RoundBundle) Pack(update []float64, metrics map[string]float64) []float64 {
	out := make([]float64, 0, b.UpdateDim+len(b.Metrics))
	out = append(out, update...)
	for _, m := range b.Metrics {
		out = append(out, metrics[m])
	}
	return out
}

// Unpack splits a secure sum into the summed update and summed metrics.
func (b *RoundBundle) Unpack(sum []float64) (update []float64, metrics map[string]float64) {
	update = sum[:b.UpdateDim]
	metrics = map[string]float64{}
	for i, m := range b.Metrics {
		metrics[m] = sum[b.UpdateDim+i]
	}
	return update, metrics
}
