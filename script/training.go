package script

import (
	"math"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// TrainingPolicy is the engine's rule for every model.train call the content
// makes. It is set by the engine in Env.Training, never by content: no
// argument of model.train can weaken it, and content cannot read or change
// it.
//
// With DP set, every model.train run is DP-SGD (model.DPSGD) with the
// policy's sampling rate Q, clipping bound Clip and noise multiplier Sigma,
// whatever optimizer, batch size or DP-looking options the content passes
// (there are none to pass: model.train has no argument that mentions DP).
// The number of DP-SGD steps of one run is what the content asks for
// (steps, or epochs·round(1/Q)); DP.Steps > 0 caps the steps of all runs of
// one Call together, and a run that would start with the allowance spent is
// refused with diag.FLDPSteps. Sampling and noise come from model's
// cryptographically secure generators: there is deliberately no way to hand
// in a predictable noise source.
//
// Trained, when set, is called synchronously after each successful
// model.train run with what ran, so the engine can charge a privacy ledger
// for exactly the mechanism applied. It is called on the Call's goroutine.
type TrainingPolicy struct {
	DP      *model.DPSGD
	Trained func(TrainRun)
}

// TrainRun describes one model.train run inside a Call.
type TrainRun struct {
	Rows     int          // rows of the dataset trained on
	Steps    int          // optimizer steps taken
	Examples int          // example gradients computed (under DP, the sum of the Poisson sample sizes)
	DP       *model.DPSGD // the DP-SGD configuration that ran (Steps = steps taken), nil without DP
}

// apply makes cfg obey the policy: under DP it sets cfg.DP, with the steps
// the content asked for capped by what the call has left. used is the number
// of DP-SGD steps earlier runs of the call took.
func (p *TrainingPolicy) apply(cfg *model.TrainConfig, used int) error {
	if p == nil || p.DP == nil {
		return nil
	}
	want := cfg.Steps
	if want == 0 {
		want = cfg.Epochs * max(1, int(math.Round(1/p.DP.Q)))
	}
	if p.DP.Steps > 0 {
		left := p.DP.Steps - used
		if left <= 0 {
			return diag.New(diag.FLDPSteps, "model.train", "the DP-SGD allowance of %d steps for this call is spent", p.DP.Steps).
				WithHelp("train once per client step, or with fewer steps; the silo's privacy settings fix the allowance")
		}
		want = min(want, left)
	}
	dp := *p.DP
	dp.Steps = want // 0 (nothing asked) is refused by model.Train
	cfg.DP = &dp
	return nil
}
