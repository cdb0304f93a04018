package silo

import (
	"context"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// admit reads the round (its bundle and its run's spec) and decides
// whether the silo takes part: the parent cluster's verdict, the policy,
// the ledger and the round log, every refusal at once, before anything is
// computed. It ends holding the round's lock, with at.paid set when an
// earlier attempt already paid for the round.
func (at *roundAttempt) admit(ctx context.Context) error {
	if err := at.readBundle(ctx); err != nil {
		return err
	}
	if err := at.readSpec(); err != nil {
		return err
	}
	if err := at.request(); err != nil {
		return err
	}
	// Nothing keyed to the round's Params leaves before the parent has
	// confirmed them: no advert, no share box, no (re-sent) input.
	if err := at.parentOK(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return decline(err)
	}
	return at.checkPolicy(ctx)
}

// readBundle fetches and checks the round bundle, starts the parent's
// check of it, and starts fetching the run spec and the global model.
func (at *roundAttempt) readBundle(ctx context.Context) error {
	a, st := at.a, at.st
	// The run spec is named by the job (st.Run, checked against the
	// bundle below): fetched alongside the bundle, once per run.
	at.specBlob = a.prefetch(ctx, st.Run)
	raw, err := a.blobs().GetBlob(ctx, st.Bundle)
	if err != nil {
		return fmt.Errorf("fetching the round bundle: %w", err)
	}
	var b fl.RoundBundle
	if err := content.Decode(raw, &b); err != nil {
		return decline(at.bad("the round bundle %s cannot be decoded: %v", st.Bundle.Short(), err))
	}
	at.rec.SecAggRound = b.SecAgg.Round
	if b.Format != fl.RoundFormat || b.Run != st.Run || b.Round != st.Round {
		return decline(at.bad("the round bundle (format %q, run %s, round %d) is not this job's round", b.Format, b.Run.Short(), b.Round))
	}
	// A silo led by a child cluster checks the round with the parent
	// (parent.go) while the spec and model arrive; the verdict is waited
	// for before the round's lock, ledger and journal.
	at.parentOK = a.startParentCheck(ctx, at.g, st, raw, b, at.subject)
	// A hierarchical round (a tree of clusters): the silo takes part in
	// its sub-cohort's round, hosted by the child cluster it belongs to,
	// with the Params — and the parent's key — of the parent's round
	// bundle; the strategy still sees the whole cohort's size.
	at.sites = len(b.SecAgg.Members)
	sub, ok := b.ForSite(a.Name)
	if !ok {
		return decline(diag.New(diag.SecAggUnknownSite, at.subject, "this silo is in none of the hierarchical round's sub-cohorts").
			WithHelp("the round was planned without this silo; it sends nothing"))
	}
	at.b = sub
	at.rec.SecAggRound = sub.SecAgg.Round
	// The global model (data coming in, nothing going out) is fetched
	// while the run spec arrives and the round is checked, not after
	// (issue 19); a round that ends without it stops the fetch.
	at.from, at.staleness = sub.BaseOf(a.Name)
	gctx, stop := context.WithCancel(ctx)
	at.stopGlobal = stop
	at.globalBlob = a.fetchAsync(gctx, at.from)
	return nil
}

// readSpec waits for the run spec and checks the round against it.
func (at *roundAttempt) readSpec() error {
	raw, err := at.specBlob()
	if err != nil {
		return fmt.Errorf("fetching the run spec: %w", err)
	}
	if err := content.Decode(raw, &at.spec); err != nil {
		return decline(at.bad("the run spec %s cannot be decoded: %v", at.b.Run.Short(), err))
	}
	if at.spec.Strategy != at.b.Strategy {
		return decline(at.bad("the round names strategy %s but its run has %s", at.b.Strategy.Short(), at.spec.Strategy.Short()))
	}
	return nil
}

// request is what the policy is asked about the round (RoundRequest): the
// run's spec, read with the round's parameters, which must agree.
func (at *roundAttempt) request() error {
	a, b, spec := at.a, at.b, at.spec.Spec
	at.rec.Dataset = spec.Dataset
	unit := fl.UnitRecord
	if d, ok := a.Config.Dataset(spec.Dataset); ok {
		at.rec.Label = d.Label
		if d.Unit != "" {
			unit = d.Unit
		}
	}
	threshold, err := b.SecAgg.EffectiveThreshold()
	if err != nil {
		return decline(err)
	}
	if b.HE != nil {
		// The policy below is checked against the cohort and threshold
		// the sum is really formed with: the HE parameters'.
		if threshold, err = heThreshold(b); err != nil {
			return decline(at.bad("%v", err))
		}
	}
	var masking secagg.Protocol
	if b.HE == nil {
		if masking, _, _, err = b.SecAgg.Degree(); err != nil {
			return decline(err)
		}
	}
	at.req = RoundRequest{
		Run: string(at.st.Run), Round: at.st.Round, StrategyRef: at.spec.Strategy, StrategyName: spec.Strategy,
		Dataset: spec.Dataset, Privacy: spec.StepPrivacy(unit, b.Step), Cohort: len(b.SecAgg.Members),
		Threshold: threshold, Masking: masking, Regime: a.Fed.Regime, SecureAgg: spec.SecureAgg, Step: b.Step,
		Aggregation: aggMode(b), PublicRows: b.Step == fl.StepStats && spec.PublicRows, Trainer: at.spec.Trainer,
	}
	if n := at.spec.NumParams(); n > 0 {
		at.req.ModelParams, at.req.RoundValues = n, n+b.SecAgg.Dim
	}
	if want := spec.AggregationMode(); want != at.req.Aggregation {
		return decline(at.bad("the round forms its sum by %s but its run asks for %s", at.req.Aggregation, want))
	}
	if want := spec.Masking; want != "" && b.HE == nil && string(b.SecAgg.Protocol) != want {
		return decline(at.bad("the round masks by %q but its run asks for %s", b.SecAgg.Protocol, want))
	}
	f, err := b.SecAgg.FracBits()
	if err != nil {
		return decline(err)
	}
	at.req.Privacy.GridBits = f // the grid the sum is decoded from
	return nil
}

// checkPolicy takes the round's lock and checks the round against the
// policy, the ledger and the round log. From the look at the ledger to
// the charge, a round's attempts go one at a time: a retry that started
// while the abandoned attempt was charging finds the charge and re-sends
// what it paid for. The lock is not held through secure aggregation: an
// attempt stuck on a dead host must not hold up the retry.
func (at *roundAttempt) checkPolicy(ctx context.Context) error {
	a := at.a
	at.now = a.now()
	at.consumer = Consumer(at.req.Run, at.req.Round)
	if err := at.lock(ctx); err != nil {
		return err
	}
	paid, err := a.chargedFor(at.consumer)
	if err == nil && paid == nil {
		// An evaluation step on a separate evaluation dataset pays there.
		paid, err = a.chargedFor(at.consumer + "-eval")
	}
	if err != nil {
		return decline(err)
	}
	ds := a.Policy.CheckRound(at.req, LedgerOf(a.Ledger), at.now)
	if paid != nil {
		// The round is paid for: re-sending what was paid for spends
		// nothing, so the budget does not bind it again.
		ds = slices.DeleteFunc(ds, func(d *diag.Diagnostic) bool { return d.Code == diag.SiloBudgetOverdraft })
	}
	if ds.HasErrors() {
		return decline(ds)
	}
	if err := checkRelease(at.subject, at.req.Privacy, at.b); err != nil {
		return decline(err)
	}
	if !a.memberOf(at.b) {
		return decline(diag.New(diag.SecAggUnknownSite, at.subject, "this silo is not among the round's secure-aggregation members").
			WithHelp("the round was planned without this silo; it sends nothing"))
	}
	at.paid = paid
	return nil
}

func (a *Appliance) memberOf(b fl.RoundBundle) bool {
	pub := a.ID.Public().Ed25519()
	for _, m := range b.SecAgg.Members {
		if m.ID == a.Name && pub.Equal(m.Key) {
			return true
		}
	}
	return false
}

// chargedFor returns the ledger's charge for consumer, or nil.
func (a *Appliance) chargedFor(consumer string) (*dp.Entry, error) {
	snap, err := a.Ledger.Snapshot()
	if err != nil {
		return nil, err
	}
	for _, e := range snap.Entries() {
		if e.Kind == dp.KindCharge && e.Charge != nil && e.Charge.Consumer == consumer {
			return &e, nil
		}
	}
	return nil, nil
}

// lockRound takes the lock of one round's charge, or gives up when ctx
// ends.
func (a *Appliance) lockRound(ctx context.Context, consumer string) (unlock func(), err error) {
	v, _ := a.rounds.LoadOrStore(consumer, make(chan struct{}, 1))
	ch := v.(chan struct{})
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
