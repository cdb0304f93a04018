package fl

import (
	"iter"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/model"
)

// EvalSums scores parameters w of a model spec on rows d (already
// standardised as the run standardises) and returns the held-out metric
// sums a silo releases without DP: eval_examples, eval_loss (Σ per-row
// loss) and eval_correct — exactly model.Evaluate's N, N·Loss and Correct,
// so `scellis model eval` on the same rows gives the same accuracy.
func EvalSums(spec model.Spec, w []float64, d *model.Dataset) (map[string]float64, error) {
	m := &model.Model{Spec: spec, Params: w}
	if err := m.Check(d); err != nil {
		return nil, err
	}
	out := map[string]float64{"eval_examples": 0, "eval_loss": 0, "eval_correct": 0}
	if d.Rows() == 0 {
		return out, nil
	}
	met := model.Evaluate(m, d)
	out["eval_examples"] = float64(met.N)
	out["eval_loss"] = met.Loss * float64(met.N)
	out["eval_correct"] = float64(met.Correct)
	return out, nil
}

// EvalRecords yields each held-out row's metric vector under DP, in
// EvalMetrics order: (correct 0/1, 1, loss capped at EvalLossCap), so one
// row moves the sums by at most EvalSensitivity().
func EvalRecords(spec model.Spec, w []float64, d *model.Dataset) (iter.Seq[[]float64], error) {
	m := &model.Model{Spec: spec, Params: w}
	if err := m.Check(d); err != nil {
		return nil, err
	}
	return func(yield func([]float64) bool) {
		v := make([]float64, 3)
		for i, p := range m.Predictions(d) {
			y := d.Y[i]
			var loss float64
			correct := false
			switch {
			case spec.ClassCount() == 0: // regression
				r := p[0] - y
				loss = 0.5 * r * r
			case len(p) == 1:
				py := p[0]
				if y == 0 {
					py = 1 - py
				}
				loss = -math.Log(max(py, 1e-300))
				correct = (p[0] >= 0.5) == (y == 1)
			default:
				c := int(y) // Check: a class of the model
				loss = -math.Log(max(p[c], 1e-300))
				correct = slices.Index(p, slices.Max(p)) == c
			}
			v[0], v[1], v[2] = 0, 1, min(loss, EvalLossCap)
			if correct {
				v[0] = 1
			}
			if !yield(v) {
				return
			}
		}
	}, nil
}

func matrixOf(r, c int, data []float64) *mat.Dense {
	if r == 0 {
		return nil
	}
	return mat.NewDense(r, c, data)
}
