package silo

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// restore takes the place of prepare, train and release in a retried
// round the silo already paid for (at.paid): it restores, for contribute
// to re-send into the new secure aggregation, exactly the input and
// weight it released for this round before (cached at release), and
// charges nothing. Without the cache, or if the round now starts from
// another model, it declines: a second, different update would be a
// second release of the same round.
func (at *roundAttempt) restore(context.Context) error {
	at.unlock() // the charge is in the ledger: nothing more to decide
	at.stopGlobal()
	paid, b := at.paid, at.b
	at.rec.LedgerEntry, at.rec.Mechanisms, at.rec.Epsilon = paid.Hash, paid.Charge.Mechanisms, paid.Charge.Epsilon
	once := func(why string) error {
		// The charge stands (an earlier attempt paid it): the record
		// names it, so it is visible and accounted even though nothing is
		// sent this time.
		return decline(diag.New(diag.RunBadRound, at.subject, "the ledger already holds a charge for this round (entry %s) and %s", paid.Hash.Short(), why).
			WithHelp("a round is paid for and sent at most once; it goes on without this silo"))
	}
	rel, err := at.a.loadReleased(at.rec.Run, at.rec.Round)
	switch {
	case err != nil:
		return once(fmt.Sprintf("its release cannot be re-sent: %v", err))
	case rel.Global != at.from:
		return once(fmt.Sprintf("the round now starts from model %s, not %s that the paid update was trained from", at.from.Short(), rel.Global.Short()))
	case len(rel.Values)+len(rel.Encoded) != b.SecAgg.Dim || (rel.Encoded != nil) != (b.SecAgg.GridBits > 0):
		return once(fmt.Sprintf("the round sums %d values (grid bits %d), the paid release has %d float and %d grid values",
			b.SecAgg.Dim, b.SecAgg.GridBits, len(rel.Values), len(rel.Encoded)))
	}
	at.in = wire.Input{Values: rel.Values, Encoded: rel.Encoded, Weight: rel.Weight, MinSurvivors: max(at.a.Policy.MinCohort, secagg.MinSites)}
	at.digest = releaseDigest(at.in)
	// The retried round may have another cohort: the release must still
	// fit its ring (the same checks as before the charge).
	if err := at.fits(); err != nil {
		return once(fmt.Sprintf("its paid release does not fit the retried round: %v", err))
	}
	if state, err := fl.DecodeState(rel.State); err == nil {
		at.out.State, at.keepState = state, true
	}
	return nil
}
