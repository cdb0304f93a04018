package silo

import (
	"context"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/hewire"
	"github.com/scellis/scellis/secagg/wire"
)

// aggMode is the mode the round's bundle forms its sum in.
func aggMode(b fl.RoundBundle) string {
	if b.HE != nil {
		return fl.AggThresholdHE
	}
	return fl.AggMasking
}

// checkHE refuses, before anything is charged, an input a threshold-he
// round could not carry: its integers beyond the round's per-site bound.
func (a *Appliance) checkHE(b fl.RoundBundle, in wire.Input) error {
	if b.HE == nil {
		return nil
	}
	p, err := he.NewParty(b.HE.Params, a.Name, a.ID.PrivateKey())
	if err != nil {
		return err
	}
	y, err := b.HE.Encode(in.Values, in.Encoded, in.Weight, b.SecAgg.Weighted)
	if err != nil {
		return err
	}
	defer clear(y)
	return p.CheckInput(y)
}

// participate sends the charged input into the round's secure sum, by
// pairwise masking or threshold-he as the bundle says. Only after the
// ledger charge (law 6): the input leaves during the call.
func (a *Appliance) participate(ctx context.Context, base string, b fl.RoundBundle, in wire.Input) error {
	if b.HE == nil {
		return wire.ParticipateWith(ctx, a.HTTP, base, b.SecAgg, a.ID.PrivateKey(), in)
	}
	y, err := b.HE.Encode(in.Values, in.Encoded, in.Weight, b.SecAgg.Weighted)
	if err != nil {
		return err
	}
	defer clear(y)
	return hewire.Participate(ctx, a.HTTP, base, b.HE.Params, a.ID.PrivateKey(), y, in.MinSurvivors)
}
