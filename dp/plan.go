package dp

import (
	"math"

	"github.com/scellis/scellis/diag"
)

// Plan is a recommended record-level DP-SGD setting for a federated run:
// what to write in the run's privacy section (sigma, q, steps) and the
// strategy's local training (one model.train of Steps steps per round).
type Plan struct {
	Sigma         float64 `json:"sigma"`           // noise multiplier
	Q             float64 `json:"q"`               // Poisson sampling rate
	Batch         int     `json:"batch"`           // expected batch size q·rows
	StepsPerRound int     `json:"steps_per_round"` // DP-SGD steps per round (privacy.steps)
	Rounds        int     `json:"rounds"`
	Epsilon       float64 `json:"epsilon"`       // ε of the whole run at Delta, composed (with the base mechanisms)
	RoundEpsilon  float64 `json:"round_epsilon"` // ε of one round alone at Delta
	Delta         float64 `json:"delta"`
}

// Plan limits: the expected batch and the noise multiplier the planner
// aims for. DP-SGD learns well with batches of a few dozen to a few hundred
// records and σ around 1–2 (Abadi et al. 2016; De et al. 2022); far larger σ
// drowns the gradient, far smaller wastes the budget on few steps.
const (
	planMinBatch = 16
	planMaxBatch = 256
	planMaxSigma = 2.5
)

// PlanDPSGD recommends record-level DP-SGD settings for a run of rounds
// rounds over silos of rows records each, spending at most eps (composed
// over the run) and at most roundEps in any one round alone, at delta: an
// expected batch of rows/25 (16 to 256, at most the rows), one local epoch
// per round (1/q steps), fewer steps when the noise that budget needs would
// exceed σ = 2.5, and σ the smallest that meets both targets
// (Calibrate). Every ε it reports is the accountant's.
func PlanDPSGD(eps, roundEps, delta float64, rows, rounds int, orders []float64, conv Conversion) (Plan, error) {
	return PlanDPSGDAfter(eps, roundEps, delta, rows, rounds, nil, orders, conv)
}

// PlanDPSGDAfter is PlanDPSGD for training that shares the run's budget
// with other releases (a statistics step, evaluations): base is their RDP
// on orders (nil: none), composed with the training in eps and in the
// plan's Epsilon.
func PlanDPSGDAfter(eps, roundEps, delta float64, rows, rounds int, base, orders []float64, conv Conversion) (Plan, error) {
	if err := checkEpsilon(eps); err != nil {
		return Plan{}, err
	}
	if err := checkEpsilon(roundEps); err != nil {
		return Plan{}, err
	}
	if err := checkDelta(delta); err != nil {
		return Plan{}, err
	}
	if rows < 1 || rounds < 1 {
		return Plan{}, diag.New(diag.DPBadSteps, "plan", "%d rows and %d rounds: both must be at least 1", rows, rounds).
			WithHelp("give the number of records a silo holds (--rows) and the run's rounds (--rounds)")
	}
	if orders == nil {
		orders = DefaultOrders()
	}
	batch := min(max(int(math.Round(float64(rows)/25)), planMinBatch), planMaxBatch, rows)
	q := float64(batch) / float64(rows)
	steps := int(math.Ceil(1 / q))
	sigmaFor := func(s int) (float64, error) {
		a, err := CalibrateAfter(eps, delta, q, int64(s)*int64(rounds), base, orders, conv)
		if err != nil {
			return 0, err
		}
		b, err := Calibrate(roundEps, delta, q, int64(s), orders, conv)
		if err != nil {
			return 0, err
		}
		return math.Max(a, b), nil
	}
	sigma, err := sigmaFor(steps)
	if err != nil {
		return Plan{}, err
	}
	for sigma > planMaxSigma && steps > 1 {
		steps = max(1, steps/2)
		if sigma, err = sigmaFor(steps); err != nil {
			return Plan{}, err
		}
	}
	p := Plan{Sigma: sigma, Q: q, Batch: batch, StepsPerRound: steps, Rounds: rounds, Delta: delta}
	run, err := SubsampledGaussian(sigma, q, int64(steps)*int64(rounds)).RDP(orders)
	if err != nil {
		return Plan{}, err
	}
	for i, v := range base {
		run[i] += v
	}
	if p.Epsilon, _, err = Epsilon(orders, run, delta, conv); err != nil {
		return Plan{}, err
	}
	one, _ := SubsampledGaussian(sigma, q, int64(steps)).RDP(orders)
	if p.RoundEpsilon, _, err = Epsilon(orders, one, delta, conv); err != nil {
		return Plan{}, err
	}
	return p, nil
}
