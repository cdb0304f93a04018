package fl

import "testing"

// Noised sums never make an impossible ratio: an accuracy above 1 or below
// 0, a negative loss (post-processing of a DP release).
func TestRoundSummaryClampsNoisedRatios(t *testing.T) {
	row := NewRoundSummary(3, StepEval, []string{"a", "b", "c"}, nil,
		map[string]float64{"eval_examples": 40, "eval_correct": 52.8, "eval_loss": -3}, "")
	if row.EvalAcc != 1 || row.EvalLoss != 0 || row.EvalRows != 40 {
		t.Fatalf("eval accuracy %v, loss %v, rows %v; want 1, 0, 40", row.EvalAcc, row.EvalLoss, row.EvalRows)
	}
	row = NewRoundSummary(3, StepEval, nil, nil, map[string]float64{"eval_examples": 40, "eval_correct": -2, "eval_loss": 20}, "")
	if row.EvalAcc != 0 || row.EvalLoss != 0.5 {
		t.Fatalf("eval accuracy %v, loss %v; want 0, 0.5", row.EvalAcc, row.EvalLoss)
	}
	if row.Sums["eval_correct"] != -2 {
		t.Fatal("the released sums were changed")
	}
}
