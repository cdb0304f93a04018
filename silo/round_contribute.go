package silo

import (
	"context"
	"errors"
	"time"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/wire"
)

// contribute sends the charged input into the round's secure sum — masked
// (pairwise or SecAgg+) or encrypted (threshold-he), as the bundle says —
// through the key exchange started in prepare, or, without one (a re-sent
// release, threshold-he), on the host it finds. The input is cleared once
// sent.
func (at *roundAttempt) contribute(ctx context.Context) error {
	var err error
	if at.kx != nil {
		at.base, err = at.kx.give(at.in) // the charge is durable: the update may leave
	} else if at.base, err = at.a.secaggHost(ctx, at.b); err == nil {
		err = at.a.participate(ctx, at.base, at.b, at.in)
	}
	clear(at.in.Values)
	clear(at.in.Encoded)
	if err != nil {
		in := ": secure aggregation"
		if at.paid != nil {
			in += " (re-sent release)"
		}
		return failErr{error: err, in: in}
	}
	return nil
}

// secaggHost finds the aggregator hosting the round's secure aggregation:
// the first of a.SecAgg that does not answer "not open here" (the round
// lives on the leader that opened it). It keeps trying until ctx ends.
func (a *Appliance) secaggHost(ctx context.Context, b fl.RoundBundle) (string, error) {
	if m, ok := a.Fed.Member(b.Reducer); ok && b.Reducer != "" && m.Role == identity.Aggregator && m.Address != "" {
		return "https://" + m.Address, nil // the bundle names the host
	}
	if len(a.SecAgg) == 1 {
		return a.SecAgg[0], nil
	}
	if len(a.SecAgg) == 0 {
		return "", errors.New("no aggregator address to take part in secure aggregation on")
	}
	path := wire.RoundPath(b.SecAgg.Round) + "keyset"
	for {
		for _, base := range a.SecAgg {
			if a.hosts(ctx, base, path) {
				return base, nil
			}
		}
		t := time.NewTimer(a.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
	}
}
