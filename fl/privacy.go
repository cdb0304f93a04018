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
// UnitRecord: SampleRate is DP-SGD's Poisson sampling rate (the run's
// privacy.q), Clip the per-example bound, Sigma the noise multiplier and
// Steps, when > 0, the most DP-SGD steps the client step may take in total
// (all its model.train runs).
//
// UnitSilo: Clip bounds the L2 norm of the whole update (after the
// strategy's concatenation), Sigma is the noise multiplier. A silo takes
// part in every round it accepts and its participation is public (its
// contribution record, the round's participants), so no sampling hides it:
// a round is the plain Gaussian mechanism, q = 1. SampleRate must then be
// unset (0) or 1, and Participation too — secret participation, which
// alone would make amplification by sampling legitimate, is not
// implemented, so a rate below 1 is refused rather than undercharged.
type Privacy struct {
	Unit Unit
	// SampleRate is DP-SGD's per-record Poisson sampling rate (record
	// level only); 0 means unset.
	SampleRate float64
	// Participation is the probability a silo takes part in a round
	// (update level); 0 means unset, which is 1. Only 1 is accepted.
	Participation float64
	Clip          float64
	Sigma         float64
	Steps         int
	// GridBits is the fraction bits f of the secure-aggregation grid the
	// update is released on (the round's secagg.Params.GridBits); 0 picks
	// dp.GridFracBits(Clip, len(update)).
	GridBits int
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
	silo := func(format string, args ...any) error {
		return diag.New(diag.FLBadPrivacy, "privacy "+string(p.Unit), format, args...).
			WithHelp("remove privacy.q and privacy.participation from the run (or set them to 1) for silo-level datasets; scellis privacy calibrate --q 1 chooses σ for a target ε per round")
	}
	finitePos := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	switch p.Unit {
	case UnitNone:
		return nil
	case UnitRecord:
		if !(p.SampleRate > 0 && p.SampleRate <= 1) {
			return bad("privacy.q = %v: DP-SGD's sampling rate must lie in (0, 1]", p.SampleRate)
		}
		if p.Steps < 0 {
			return bad("step allowance %d is negative", p.Steps)
		}
		if p.Participation != 0 && p.Participation != 1 {
			return silo("privacy.participation = %v: secret participation is not implemented; a silo takes part in every round it accepts (participation 1)", p.Participation)
		}
	case UnitSilo:
		if p.SampleRate != 0 && p.SampleRate != 1 {
			return silo("privacy.q = %v: q is DP-SGD's per-record sampling rate, and this dataset is protected at the silo level, where a round releases the whole update every time the silo takes part (q = 1); no sampling happens, so a q below 1 would undercharge every round", p.SampleRate)
		}
		if p.Participation != 0 && p.Participation != 1 {
			return silo("privacy.participation = %v: secret participation is not implemented; a silo takes part in every round it accepts and its participation is public, so each round is charged at q = 1", p.Participation)
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

// Mechanisms prices a client step: the mechanisms to charge for it, as the
// accountant composes them. steps is the number of DP-SGD steps (record
// level; the client step passes the steps it took, a silo's policy the
// step allowance, the most a round can cost); it is ignored at the silo
// level, where a round is one release of the Gaussian mechanism on the
// grid with q = 1 (ReleaseUpdate adds at least σ times the sensitivity of
// the encoded, rounded update). This is the one function both the client
// step and a silo's policy price with. p must be valid (Validate).
func (p Privacy) Mechanisms(steps int) []dp.Mechanism {
	switch p.Unit {
	case UnitRecord:
		if steps <= 0 {
			return nil
		}
		return []dp.Mechanism{dp.SubsampledGaussian(p.Sigma, p.SampleRate, int64(steps))}
	case UnitSilo:
		return []dp.Mechanism{dp.SubsampledGaussian(p.Sigma, 1, 1)}
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
