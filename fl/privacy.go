package fl

import (
	"math"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

// Unit is the unit of privacy a client step protects, as a silo's dataset
// declares it.
type Unit string

const (
	// UnitNone: no differential privacy (the own regime only).
	UnitNone Unit = ""
	// UnitRecord: record-level DP-SGD inside every model.train the
	// strategy runs (per-example clipping, Poisson sampling, noise).
	UnitRecord Unit = "record"
	// UnitSilo: update-level DP: the whole update is clipped to Clip and
	// N(0, σ²·Clip²) noise added to each coordinate after client_step.
	UnitSilo Unit = "silo"
)

// Privacy says which DP the engine applies to one client step. The content
// cannot weaken it.
//
// UnitRecord: Q is DP-SGD's Poisson sampling rate, Clip the per-example
// bound, Sigma the noise multiplier and Steps, when > 0, the most DP-SGD
// steps the client step may take in total (all its model.train runs).
//
// UnitSilo: Clip bounds the L2 norm of the whole update (after the
// strategy's weighting and concatenation), Sigma is the noise multiplier and
// Q the probability the silo takes part in a round (its client-sampling
// rate; 0 means 1, every round).
type Privacy struct {
	Unit  Unit
	Q     float64
	Clip  float64
	Sigma float64
	Steps int
	// Noise is the secure noise source for update-level DP; nil draws a
	// fresh dp.NewNoise(). Record-level DP-SGD always uses model's own
	// crypto-keyed generators.
	Noise *dp.Noise
}

// Validate checks the parameters the unit needs (diag.FLBadPrivacy).
func (p Privacy) Validate() error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.FLBadPrivacy, "privacy "+string(p.Unit), format, args...).
			WithHelp("scellis privacy calibrate chooses σ for a target ε")
	}
	finitePos := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	switch p.Unit {
	case UnitNone:
		return nil
	case UnitRecord:
		if !(p.Q > 0 && p.Q <= 1) {
			return bad("sampling rate q = %v is outside (0, 1]", p.Q)
		}
		if p.Steps < 0 {
			return bad("step allowance %d is negative", p.Steps)
		}
	case UnitSilo:
		if !(p.Q >= 0 && p.Q <= 1) {
			return bad("client-sampling rate q = %v is outside [0, 1] (0 means 1)", p.Q)
		}
	default:
		return diag.New(diag.FLBadPrivacy, "privacy", "unknown unit of privacy %q", p.Unit).
			WithHelp("use %q (DP-SGD per example) or %q (the whole update per round), or none in the own regime", UnitRecord, UnitSilo)
	}
	if !finitePos(p.Clip) {
		return bad("clipping bound %v must be positive and finite", p.Clip)
	}
	if !finitePos(p.Sigma) {
		return bad("noise multiplier σ = %v must be positive and finite", p.Sigma)
	}
	return nil
}

// Mechanism is what DP ran in one client step, for the silo's ledger: the
// unit, the clipping bound, and the mechanisms to charge — pass Mechanisms
// as dp.ChargeRequest.Mechanisms before the update is released. Mechanisms
// is empty when nothing private was released (no DP, or the site declined
// the round).
type Mechanism struct {
	Unit       Unit
	Clip       float64
	Mechanisms []dp.Mechanism
}
