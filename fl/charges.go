package fl

import (
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

// RunCharges is every mechanism a silo of the run is charged over the
// whole run, step by step (Step), each at the most its step can cost: a
// statistics or evaluation step one Gaussian release of its row sums at
// its σ (StepSigma, q = 1), a training round DP-SGD's step allowance at
// record level, one release of the update at silo level (the
// mechanisms RoundRequest prices a step with). A silo's ledger composes
// them; scellis privacy plan prices a whole run with them, so a plan run
// as given fits its budget. Without DP there are none. An evaluation on a
// dataset of its own (evaluation.dataset) is charged to that dataset: the
// sum over-states the training dataset's cost then, never under-states it.
func (s *RunSpec) RunCharges(unit Unit) ([]dp.Mechanism, error) {
	p := s.Privacy(unit)
	if p.Unit == UnitNone {
		return nil, nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Unit == UnitRecord && p.Steps <= 0 {
		return nil, diag.New(diag.SiloUnpriced, "run "+s.Name, "record-level DP without a step allowance (privacy.steps): a round's ε has no bound").
			WithHelp("give privacy.steps, the most DP-SGD steps a round may take")
	}
	var out []dp.Mechanism
	for r := range s.StepCount() {
		switch kind, _ := s.Step(r); kind {
		case StepStats, StepEval:
			out = append(out, dp.SubsampledGaussian(s.StepSigma(kind), 1, 1))
		default:
			out = append(out, p.Mechanisms(p.Steps)...)
		}
	}
	return out, nil
}
