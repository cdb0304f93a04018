package silo

import (
	"context"
	"fmt"
	"sync"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/secagg"
)

// release makes what train computed ready to leave: it checks that the
// input fits the round's ring, closes the key exchange's key phase,
// caches the release durably (law 12), then charges the ledger (law 6).
// It ends the round's lock: a retry from here on finds the charge.
func (at *roundAttempt) release(ctx context.Context) error {
	if err := at.fits(); err != nil {
		return decline(err) // refused before the charge: nothing was paid for
	}
	if at.kx != nil {
		if err := at.kx.over(); err != nil {
			return fail(err) // nothing cached, nothing charged
		}
	}
	if err := at.cache(); err != nil {
		return err
	}
	if err := at.charge(); err != nil {
		return err
	}
	at.unlock() // paid (or nothing to pay): a retry now finds the charge
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	return nil
}

// fits refuses an input the round's secure sum could not carry: its
// length, weight or integers beyond the round's bounds.
func (at *roundAttempt) fits() error {
	c, err := secagg.NewClient(at.b.SecAgg, at.a.Name, at.a.ID.PrivateKey())
	if err != nil {
		return err
	}
	if at.in.Encoded != nil {
		err = c.CheckEncoded(at.in.Encoded, at.in.Weight)
	} else {
		err = c.CheckInput(at.in.Values, at.in.Weight)
	}
	if err != nil {
		return err
	}
	return at.a.checkHE(at.b, at.in)
}

// cache keeps what is released for this round, durably, before it is
// paid for (law 12); a retried round re-sends it (restore) instead of
// training and noising again. Cached at the point of release: input and
// weight are exactly what secure aggregation receives.
func (at *roundAttempt) cache() error {
	a, in := at.a, at.in
	stateBytes, err := fl.EncodeState(at.out.State)
	if err != nil {
		return decline(err)
	}
	// The release cache and the charge's outbox entry are two files, each
	// written durably before the charge; they do not depend on each other,
	// so they are written at once (one fsync wait on the round's path, not
	// two in a row).
	charges := len(at.out.Mechanism.Mechanisms) > 0
	var outboxErr error
	var wrote sync.WaitGroup
	if charges {
		// The charge's record goes to the outbox first: if the silo dies
		// between the charge and its report, it reports it when it starts.
		wrote.Go(func() { outboxErr = a.outboxPut(outboxEntry{Consumer: at.consumer, Record: at.rec}) })
	}
	err = a.saveReleased(released{Format: releasedFormat, Run: at.st.Run, Round: at.st.Round, Global: at.from,
		Values: in.Values, Encoded: in.Encoded, Weight: in.Weight, State: stateBytes})
	wrote.Wait()
	if err != nil {
		if charges && outboxErr == nil {
			// No charge follows: the entry must not outlive this attempt
			// (a later attempt of the round, under another job, may charge
			// the same consumer).
			a.outboxDone(at.g.Job, at.g.Shard, false)
		}
		return at.unsent(fmt.Errorf("caching the round's release: %w", err))
	}
	if outboxErr != nil {
		return at.unsent(fmt.Errorf("writing the round's outbox entry: %w", outboxErr))
	}
	if a.Logf != nil { // the digest hashes the whole release: only for a log that shows it
		a.logf("%s: cached the round's release %s", at.subject, releaseDigest(in))
	}
	return nil
}

// charge charges the ledger for the round's release (fsync'd), before
// anything leaves the process (law 6): held-out metrics of a separate
// evaluation dataset to that dataset, the rest to the run's.
func (at *roundAttempt) charge() error {
	a, mechs := at.a, at.out.Mechanism.Mechanisms
	if len(at.evalMechs) > 0 {
		if eval := at.spec.Spec.Eval.Dataset; eval == "" {
			mechs = append(mechs, at.evalMechs...)
		} else {
			// The held-out rows are another dataset's: its own budget pays.
			e, err := a.Ledger.Charge(dp.ChargeRequest{Dataset: eval, Consumer: at.consumer + "-eval", Mechanisms: at.evalMechs})
			if err != nil {
				return decline(err)
			}
			a.anchorLedger()
			a.logf("%s: charged evaluation dataset %s ε = %.6g, ledger entry %s", at.subject, eval, e.Charge.Epsilon, e.Hash.Short())
		}
	}
	if len(mechs) == 0 {
		return nil
	}
	e, err := a.Ledger.Charge(dp.ChargeRequest{Dataset: at.req.Dataset, Consumer: at.consumer, Mechanisms: mechs})
	if err != nil {
		return decline(err) // an overdraft raced in: nothing leaves
	}
	a.anchorLedger()
	at.rec.LedgerEntry, at.rec.Mechanisms, at.rec.Epsilon = e.Hash, e.Charge.Mechanisms, e.Charge.Epsilon
	a.logf("%s: charged dataset %s ε = %.6g (cumulative %.6g), ledger entry %s", at.subject, at.req.Dataset, e.Charge.Epsilon, e.Charge.Cumulative, e.Hash.Short())
	if testfault.Armed(testfault.KillAfterCharge) {
		a.logf("%s: test fault %s: the charge is durable; killing the process", at.subject, testfault.KillAfterCharge)
		testfault.Kill()
	}
	return nil
}

// checkRelease refuses, before anything is computed or charged, a round
// whose sum would carry something DP does not pay for, or whose grid cannot
// hold the noise: under DP the summed vector is the update alone (training
// metrics stay in the silo: they would leave unnoised and uncharged), and
// the update's noised integers, with HeadroomSigmas noise deviations to
// spare, must fit the ring's per-site bound (else the sum could wrap).
func checkRelease(subject string, p fl.Privacy, b fl.RoundBundle) error {
	if p.Unit == fl.UnitNone {
		return nil
	}
	if b.Step == fl.StepStats || b.Step == fl.StepEval {
		// The whole summed vector is one release of per-row sums on the
		// grid, noised and charged (fl.Privacy.ReleaseRecordSums).
		if b.SecAgg.GridBits <= 0 {
			return diag.New(diag.FLBadPrivacy, subject, "the %s step names no grid to release its sums on", b.Step).
				WithHelp("under DP the aggregator fixes the grid of every release; the round was planned by an older aggregator")
		}
		return nil
	}
	if len(b.Metrics) > 0 || b.SecAgg.Dim != b.UpdateDim {
		return diag.New(diag.FLBadPrivacy, subject, "the round sums %d training metrics (%v) with the update; under differential privacy they would leave unnoised and uncharged", len(b.Metrics), b.Metrics).
			WithHelp("under DP the round's sum holds the update only; metrics come from a charged evaluation")
	}
	if p.Unit != fl.UnitSilo {
		return nil
	}
	g := p.UpdateMechanism(b.UpdateDim)
	if err := g.Validate(); err != nil {
		return err
	}
	bound, err := b.SecAgg.EncodedBound()
	if err != nil {
		return err
	}
	if b.HE != nil {
		bound = b.HE.Params.Bound // threshold-he sums on a smaller ring
	}
	if m := g.MaxMagnitude(); m > float64(bound) {
		return diag.New(diag.DPRingHeadroom, subject, "the noised update can reach %.4g on the grid (clip·2^%d plus %d noise deviations of %d), beyond the ring's per-site bound %d",
			m, g.FracBits, dp.HeadroomSigmas, g.NoiseScale(), bound).
			WithHelp("lower privacy.sigma or privacy.clip, or run with fewer sites: the secure sum would wrap around")
	}
	return nil
}
