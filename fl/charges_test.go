package fl

import (
	"testing"

	"github.com/scellis/scellis/dp"
)

// RunCharges lists what a silo is charged, step by step: the statistics
// at sums_sigma, every training round at its step allowance, every
// evaluation at eval_sigma; nothing without DP, and no bound without a
// step allowance at record level.
func TestRunCharges(t *testing.T) {
	s := &RunSpec{Name: "r", Rounds: 3, DP: true, Clip: 1, Sigma: 1.2, Q: 0.1, Steps: 7, SumsSigma: 9, EvalSigma: 15,
		Eval: EvalSpec{Holdout: 0.2, Every: 2}}
	got, err := s.RunCharges(UnitRecord)
	if err != nil {
		t.Fatal(err)
	}
	want := []dp.Mechanism{dp.SubsampledGaussian(9, 1, 1), dp.SubsampledGaussian(1.2, 0.1, 7), dp.SubsampledGaussian(1.2, 0.1, 7),
		dp.SubsampledGaussian(15, 1, 1), dp.SubsampledGaussian(1.2, 0.1, 7), dp.SubsampledGaussian(15, 1, 1)}
	if len(got) != len(want) || len(got) != s.StepCount() {
		t.Fatalf("%d charges for %d steps: %+v", len(got), s.StepCount(), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("step %d charged %+v, want %+v", i, got[i], want[i])
		}
	}
	s.Q = 0
	if silo, err := s.RunCharges(UnitSilo); err != nil || silo[1] != dp.SubsampledGaussian(1.2, 1, 1) {
		t.Fatalf("update level: %+v %v", silo, err)
	}
	s.Q, s.Steps = 0.1, 0
	if _, err := s.RunCharges(UnitRecord); err == nil {
		t.Fatal("record-level DP without a step allowance was priced")
	}
	s.DP = false
	if none, err := s.RunCharges(UnitRecord); err != nil || none != nil {
		t.Fatalf("without DP: %v %v", none, err)
	}
}
