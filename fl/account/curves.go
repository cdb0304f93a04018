package account

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/fl"
)

// A run's loss curves come from the metric sums its steps released. Under
// DP a training round sums its noised update alone (the metrics would
// leave unnoised and uncharged: fl.RunSpec.Summed), so the only points are
// those of a charged, noised evaluation the run declares; without one
// there is nothing to draw, and the Studio and `fl plot` say why instead
// of drawing empty axes.

// HasCurve reports whether a step released a point of a loss curve: a
// training loss, or held-out metrics.
func HasCurve(s fl.RoundSummary) bool {
	return s.Sums["examples"] > 0 || s.EvalRows > 0
}

// CurveNote says what a run's curves are: why there is none to draw yet
// (no step released a loss or held-out metric), or, for a DP run that has
// points, that they are its charged evaluation's. "" for a run without DP
// whose curves exist.
func CurveNote(spec *fl.RunSpec, steps []Step) string {
	points := false
	for _, s := range steps {
		points = points || HasCurve(s.Summary)
	}
	switch {
	case points && spec.DP:
		return "under differential privacy a training round releases its noised update only, never a loss: these points are the run's charged, noised evaluation"
	case points:
		return ""
	case spec.DP && spec.Eval.On():
		return "under differential privacy a training round releases its noised update only, never a loss: the curve comes from the run's charged, noised evaluation, which has released no result yet"
	case spec.DP:
		return "under differential privacy a training round releases its noised update only, never a loss, and this run declares no charged evaluation (evaluation: {holdout: …} in its run spec): there is no curve to draw"
	case len(steps) == 0:
		return "no step of the run has completed yet"
	default:
		return fmt.Sprintf("none of the %d completed steps released a loss (a statistics step sums feature statistics only)", len(steps))
	}
}

// Spec reads a run's canonical spec (the run's ID is its hash), once.
func (r *Reader) Spec(ctx context.Context, run content.Ref) (*fl.Canonical, error) {
	spec, err := kept(ctx, r, r.specs, run, func(b []byte) (*fl.Canonical, error) {
		var spec fl.Canonical
		return &spec, content.Decode(b, &spec)
	})
	if err != nil {
		return nil, fmt.Errorf("the run spec %s: %w", run.Short(), err)
	}
	return spec, nil
}
