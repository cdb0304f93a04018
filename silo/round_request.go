package silo

import (
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/trust"
)

// RoundRequest is what a silo is asked to do in one training round: which
// run and round, with which strategy, on which of its datasets, under which
// differential privacy, with how many sites, in which pool. Policy.CheckRound
// judges it before the silo does anything.
type RoundRequest struct {
	Run   string // the training run's ID
	Round int    // the round's index within the run
	// StrategyRef is the content ref of the strategy the round runs, and
	// StrategyName its catalog name (both as the run's job cites them).
	StrategyRef  content.Ref
	StrategyName string
	Dataset      string     // the silo's dataset the round trains on
	Privacy      fl.Privacy // unit, q, clip, σ and step allowance
	Cohort       int        // sites in the round, this one included
	// Threshold is the round's secure-aggregation threshold t (as the
	// params derive it): the fewest sites a sum can be unmasked with.
	// 0 means unknown (no secure aggregation), and is not checked.
	Threshold int
	// Masking is the round's masking protocol (secagg.Pairwise or
	// secagg.SecAggPlus); empty when the sum is not masked.
	Masking   secagg.Protocol
	Regime    trust.Regime
	SecureAgg bool
	// Aggregation is the mode the round's sum is formed in
	// (fl.AggMasking or fl.AggThresholdHE), as the round bundle runs it.
	Aggregation string
	// Step is the kind of step (fl.StepStats, fl.StepTrain, fl.StepEval;
	// empty: training): a statistics or evaluation step releases one
	// Gaussian sum of its rows, priced as such.
	Step string
	// PublicRows: the statistics step sums the dataset's row count
	// unnoised (the run's privacy.public_rows); the dataset must declare
	// its row count public.
	PublicRows bool
	// ModelParams is the run's model's parameter count, and RoundValues
	// the values the round moves through the silo (the model's parameters
	// fetched plus the values summed); 0: unknown, not checked.
	ModelParams int
	RoundValues int
	// Trainer is the content hash of the trainer the round runs instead
	// of the strategy's client step (empty: none).
	Trainer content.Ref
}

// Subject names the round in diagnostics: "run RUN round N".
func (r RoundRequest) Subject() string { return fmt.Sprintf("run %s round %d", r.Run, r.Round) }

// Key identifies the round.
func (r RoundRequest) Key() RoundKey { return RoundKey{Run: r.Run, Round: r.Round} }

// Mechanisms returns the most the round can cost in privacy, as the
// accountant composes it: nil without DP; for record-level DP, DP-SGD's
// subsampled Gaussian over the whole step allowance (a client step may take
// fewer steps, and its charge is then smaller); for update-level DP, one
// release of the Gaussian mechanism with q = 1 (fl.Privacy.Mechanisms, the
// function the client step prices with too).
// These are the mechanisms the silo's charge for the round is bounded by,
// computed from σ, q and steps — never an ε typed in by a person.
//
// Invalid privacy parameters are diag.FLBadPrivacy; record-level DP without
// a step allowance, whose cost has no bound, is diag.SiloUnpriced.
func (r RoundRequest) Mechanisms() ([]dp.Mechanism, error) {
	p := r.Privacy
	if p.Unit == fl.UnitNone {
		return nil, nil
	}
	if r.Step == fl.StepStats || r.Step == fl.StepEval {
		// One release of per-row sums on the grid: the Gaussian mechanism
		// at the run's σ, q = 1 (fl.Privacy.ReleaseRecordSums).
		if !(p.Sigma > 0) {
			return nil, diag.New(diag.FLBadPrivacy, r.Subject(), "the %s step's noise multiplier σ = %v must be positive", r.Step, p.Sigma).
				WithHelp("give privacy.sigma")
		}
		return []dp.Mechanism{dp.SubsampledGaussian(p.Sigma, 1, 1)}, nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	switch p.Unit {
	case fl.UnitRecord:
		if p.Steps <= 0 {
			return nil, diag.New(diag.SiloUnpriced, r.Subject(),
				"record-level DP without a step allowance: the round's ε has no bound before it runs").
				WithHelp("give the round's privacy a step allowance (steps), so the silo can check the most the round can cost")
		}
	}
	return p.Mechanisms(p.Steps), nil
}
