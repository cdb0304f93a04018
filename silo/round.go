package silo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// HandleRound takes part in one round for a leased shard of a round job:
//
//  1. fetch the round bundle and the run spec (blobs, by hash);
//  2. check the round against the policy, the ledger and the round log
//     (Policy.CheckRound, every refusal at once) before anything else;
//  3. fetch the strategy and the global model, run fl.ClientStep on the
//     run's dataset with the dataset's unit of privacy (client state from
//     DATA_DIR/<run>/state);
//  4. charge the ledger with the step's mechanism (fsync'd) — only then
//  5. take part in secure aggregation with the packed update and weight,
//     and save the new client state;
//  6. upload a signed Contribution and report its hash for the shard.
//
// A round the silo refuses (or cannot make sense of) is reported as a
// declined contribution, not released: the shard is assigned to this silo
// alone, so releasing it would only offer it again, and reporting lets the
// round complete without this silo (secure aggregation treats it as a
// dropout). Failures that may pass (the pool or a blob unreachable) before
// anything was charged hand the lease back, to be retried.
func (a *Appliance) HandleRound(ctx context.Context, g coordinator.LeaseGrant, st coordinator.JobStatus) {
	w := a.Worker()
	timeout := a.RoundTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	rctx, stop := w.Renewing(ctx, g, timeout)
	rctx, abandon := context.WithCancel(rctx)
	go a.watchAttempt(rctx, abandon, g.Job)
	rec, err := a.round(rctx, g, st)
	abandon()
	stop()
	if err != nil {
		// Nothing charged, nothing sent: retry later (or stop).
		if ctx.Err() == nil {
			w.ReleaseGrant(g, err)
		}
		return
	}
	if err := a.report(g, rec); err != nil {
		a.logf("run %s round %d: reporting the contribution: %v", st.Run.Short(), st.Round, err)
	}
}

// watchAttempt ends a round attempt's context when the aggregator abandons
// its job (the round is planned again, RetryRound): a silo waiting in
// secure aggregation on a host that is gone stops waiting at once and
// takes the new attempt, re-sending what it paid for. It follows the job's
// event stream (api.Client.Watch, which reconnects to another node when a
// node goes quiet and starts every connection with a fresh status) rather
// than polling: abandoning flags the job's pending shards, so the silo
// hears a "shard-flagged" event and reads the job's state once.
//
// The stream opens only once the attempt has run for watchAfter: a round
// over sooner (the common case) opens none. Over HTTP/1.1 a stream cut
// when its round ends takes its connection with it, so a stream per round
// cost every silo a fresh TLS handshake per round (issue 19). An attempt
// abandoned before then is noticed when the stream opens, which starts
// with the job's status.
func (a *Appliance) watchAttempt(ctx context.Context, abandon context.CancelFunc, job content.Ref) {
	t := time.NewTimer(watchAfter)
	select {
	case <-ctx.Done():
		t.Stop()
		return
	case <-t.C:
	}
	errAbandoned := errors.New("attempt abandoned")
	check := func() error {
		jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		js, err := a.Client.Job(jctx, job)
		cancel()
		// A child cluster cancels a round's sub-job it gives up
		// (aggregator/delegate_round.go): the same as abandoned here.
		if err == nil && (js.State == coordinator.JobAbandoned || js.State == coordinator.JobCancelledState) {
			a.logf("run %s round %d: the aggregator abandoned this attempt (job %s); stopping it", js.Run.Short(), js.Round, job.Short())
			abandon()
			return errAbandoned
		}
		return nil
	}
	a.Client.Watch(ctx, job, func(ev api.Event) error {
		switch ev.Kind {
		case "status":
			var st struct {
				State coordinator.JobState `json:"state"`
			}
			if json.Unmarshal(ev.Data, &st) == nil && (st.State == coordinator.JobAbandoned || st.State == coordinator.JobCancelledState) {
				return check()
			}
		case "shard-flagged", "lease-ended", "job-cancelled":
			return check()
		}
		return nil
	})
}

// watchAfter is how long a round attempt runs before the silo watches its
// job for abandonment (watchAttempt).
const watchAfter = time.Second

// retryable marks an error after which the lease is handed back.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

// round runs the round and returns the contribution record to report, or
// an error when nothing was charged and the shard should be retried.
func (a *Appliance) round(ctx context.Context, g coordinator.LeaseGrant, st coordinator.JobStatus) (Contribution, error) {
	rec := Contribution{Format: ContributionFormat, Run: st.Run, Round: st.Round, Job: g.Job, Shard: g.Shard, Silo: a.Name}
	subject := fmt.Sprintf("run %s round %d", st.Run.Short(), st.Round)
	decline := func(err error) (Contribution, error) {
		rec.Status = Declined
		rec.Refusals = refusalsOf(err)
		a.logRefusal(subject, err)
		return rec, nil
	}
	bad := func(format string, args ...any) error {
		return diag.New(diag.RunBadRound, subject, format, args...).
			WithHelp("the round job does not fit its run; the silo takes no part in it")
	}

	// The run spec is named by the job (st.Run, checked against the
	// bundle below): fetched alongside the bundle, once per run.
	specBlob := a.prefetch(ctx, st.Run)
	raw, err := a.blobs().GetBlob(ctx, st.Bundle)
	if err != nil {
		return rec, fmt.Errorf("fetching the round bundle: %w", err)
	}
	var b fl.RoundBundle
	if err := content.Decode(raw, &b); err != nil {
		return decline(bad("the round bundle %s cannot be decoded: %v", st.Bundle.Short(), err))
	}
	rec.SecAggRound = b.SecAgg.Round
	if b.Format != fl.RoundFormat || b.Run != st.Run || b.Round != st.Round {
		return decline(bad("the round bundle (format %q, run %s, round %d) is not this job's round", b.Format, b.Run.Short(), b.Round))
	}
	// A silo led by a child cluster checks the round with the parent
	// (parent.go) while the spec and model arrive; the verdict is waited
	// for before the round's lock, ledger and journal.
	parentVerdict := a.startParentCheck(ctx, g, st, raw, b, subject)
	// A hierarchical round (a tree of clusters): the silo takes part in
	// its sub-cohort's round, hosted by the child cluster it belongs to,
	// with the Params — and the parent's key — of the parent's round
	// bundle; the strategy still sees the whole cohort's size.
	sites := len(b.SecAgg.Members)
	sub, ok := b.ForSite(a.Name)
	if !ok {
		return decline(diag.New(diag.SecAggUnknownSite, subject, "this silo is in none of the hierarchical round's sub-cohorts").
			WithHelp("the round was planned without this silo; it sends nothing"))
	}
	b = sub
	rec.SecAggRound = b.SecAgg.Round
	// The global model (data coming in, nothing going out) is fetched
	// while the run spec arrives and the round is checked, not after
	// (issue 19); a round that ends without it stops the fetch.
	from, staleness := b.BaseOf(a.Name)
	gctx, stopGlobal := context.WithCancel(ctx)
	defer stopGlobal()
	globalBlob := a.fetchAsync(gctx, from)
	if raw, err = specBlob(); err != nil {
		return rec, fmt.Errorf("fetching the run spec: %w", err)
	}
	var spec fl.Canonical
	if err := content.Decode(raw, &spec); err != nil {
		return decline(bad("the run spec %s cannot be decoded: %v", b.Run.Short(), err))
	}
	if spec.Strategy != b.Strategy {
		return decline(bad("the round names strategy %s but its run has %s", b.Strategy.Short(), spec.Strategy.Short()))
	}
	rec.Dataset = spec.Spec.Dataset
	unit := fl.UnitRecord
	if d, ok := a.Config.Dataset(spec.Spec.Dataset); ok {
		rec.Label = d.Label
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
			return decline(bad("%v", err))
		}
	}
	var masking secagg.Protocol
	if b.HE == nil {
		if masking, _, _, err = b.SecAgg.Degree(); err != nil {
			return decline(err)
		}
	}
	req := RoundRequest{
		Run: string(st.Run), Round: st.Round, StrategyRef: spec.Strategy, StrategyName: spec.Spec.Strategy,
		Dataset: spec.Spec.Dataset, Privacy: spec.Spec.StepPrivacy(unit, b.Step), Cohort: len(b.SecAgg.Members),
		Threshold: threshold, Masking: masking, Regime: a.Fed.Regime, SecureAgg: spec.Spec.SecureAgg, Step: b.Step,
		Aggregation: aggMode(b), PublicRows: b.Step == fl.StepStats && spec.Spec.PublicRows, Trainer: spec.Trainer,
	}
	if want := spec.Spec.AggregationMode(); want != req.Aggregation {
		return decline(bad("the round forms its sum by %s but its run asks for %s", req.Aggregation, want))
	}
	if want := spec.Spec.Masking; want != "" && b.HE == nil && string(b.SecAgg.Protocol) != want {
		return decline(bad("the round masks by %q but its run asks for %s", b.SecAgg.Protocol, want))
	}
	if f, err := b.SecAgg.FracBits(); err != nil {
		return decline(err)
	} else {
		req.Privacy.GridBits = f // the grid the sum is decoded from
	}
	// Nothing keyed to the round's Params leaves before the parent has
	// confirmed them: no advert, no share box, no (re-sent) input.
	if err := parentVerdict(); err != nil {
		if ctx.Err() != nil {
			return rec, ctx.Err()
		}
		return decline(err)
	}
	now := a.now()
	consumer := Consumer(req.Run, req.Round)
	// From the look at the ledger to the charge, this round's attempts go
	// one at a time: a retry that started while the abandoned attempt was
	// charging finds the charge and re-sends what it paid for.
	// The lock is not held through secure aggregation: an attempt stuck
	// on a dead host must not hold up the retry.
	unlock, err := a.lockRound(ctx, consumer)
	if err != nil {
		return rec, err
	}
	var unlockOnce sync.Once
	release := func() { unlockOnce.Do(unlock) }
	defer release()
	paid, err := a.chargedFor(consumer)
	if err == nil && paid == nil {
		// An evaluation step on a separate evaluation dataset pays there.
		paid, err = a.chargedFor(consumer + "-eval")
	}
	if err != nil {
		return decline(err)
	}
	ds := a.Policy.CheckRound(req, LedgerOf(a.Ledger), now)
	if paid != nil {
		// The round is paid for: re-sending what was paid for spends
		// nothing, so the budget does not bind it again.
		ds = slices.DeleteFunc(ds, func(d *diag.Diagnostic) bool { return d.Code == diag.SiloBudgetOverdraft })
	}
	if ds.HasErrors() {
		return decline(ds)
	}
	if err := checkRelease(subject, req.Privacy, b); err != nil {
		return decline(err)
	}
	if !a.memberOf(b) {
		return decline(diag.New(diag.SecAggUnknownSite, subject, "this silo is not among the round's secure-aggregation members").
			WithHelp("the round was planned without this silo; it sends nothing"))
	}
	if paid != nil {
		release() // the charge is in the ledger: nothing more to decide
		stopGlobal()
		return a.resend(ctx, rec, b, paid, subject)
	}
	// From here on, a decline still counts against the daily limit. The
	// journal's fsync runs while the strategy and the global model are
	// fetched; it is waited for before the run's data is read, and
	// before the round returns (a decline is reported only after that).
	journaled := a.startRecordRound(req.Key(), now)
	defer journaled()

	strategy, err := a.strategy(ctx, spec)
	if err != nil {
		if _, ok := diag.As(err); ok {
			return decline(err)
		}
		return rec, err
	}
	// A buffered-asynchronous run's silo trains from the version it last
	// fetched (RoundBundle.Base); every other round from the bundle's.
	if staleness < 0 {
		return decline(bad("staleness %d is negative", staleness))
	}
	// The key exchange of secure aggregation starts now, while the silo
	// receives the global model, trains, caches and charges; the update
	// joins it only once charged (keyExchange.give). It starts before the
	// global model is in (issue 19: the slowest silo's advert, and with it
	// the whole exchange, waited for that fetch): the advert carries
	// nothing of the model or the update. From here on nothing hands the
	// lease back to be retried: this silo's keys are in the round, and a
	// retry would bring other keys into it. A round that ends without an
	// update stops the exchange before it is reported.
	minSurvivors := max(a.Policy.MinCohort, secagg.MinSites)
	kx := a.startKeyExchange(ctx, b, minSurvivors)
	if kx != nil {
		defer kx.drop()
	}
	failed := func(err error) (Contribution, error) {
		rec.Status, rec.Refusals = Failed, refusalsOf(err)
		a.logRefusal(subject, err)
		return rec, nil
	}
	if raw, err = globalBlob(); err != nil {
		err = fmt.Errorf("fetching the global model: %w", err)
		if kx != nil && ctx.Err() == nil {
			return failed(err) // nothing charged; the round goes on without this silo
		}
		return rec, err // nothing charged: retry (or the attempt was abandoned)
	}
	global, err := fl.DecodeGlobal(raw)
	if err != nil {
		return decline(bad("the global model %s cannot be decoded: %v", from.Short(), err))
	}
	journaled() // the data is read from here on
	train, held, err := a.runData(st.Run, &spec, &b)
	if err != nil {
		return decline(err)
	}
	statePath, err := a.statePath(st.Run)
	if err != nil {
		return decline(bad("%v", err))
	}
	var out fl.ClientOutput
	in := wire.Input{MinSurvivors: minSurvivors}
	var evalMechs []dp.Mechanism // held-out metrics: charged to the evaluation dataset when it is a separate one
	switch b.Step {
	case fl.StepStats:
		// Feature statistics: Σx, Σx² and the row count of the training
		// rows; with DP on, each row scaled by the run's public feature
		// bounds and the sums released on the grid, noised and charged
		// (the count exact when the run and the dataset make it public).
		in.Weight = 1
		if req.Privacy.Unit == fl.UnitNone {
			sums, rows := fl.StatsVector(train)
			in.Values = append(sums, rows)
			break
		}
		bounds := spec.Spec.Bounds()
		if bounds.Len() != train.Dims() {
			return decline(diag.New(diag.ModelNoStatistics, subject, "the run's DP is on but it gives %d feature bounds for %d features", bounds.Len(), train.Dims()).
				WithHelp("a value's range must be bounded for the statistics' noise to mean anything; the run author sets privacy.feature_bounds"))
		}
		if in.Encoded, out.Mechanism.Mechanisms, err = req.Privacy.ReleaseStats(train, bounds, spec.Spec.PublicRows, b.SecAgg.GridBits); err != nil {
			return decline(err)
		}
	case fl.StepEval:
		in.Weight = 1
		if in.Values, in.Encoded, evalMechs, err = heldOut(&spec, global, held, req.Privacy, b.SecAgg.GridBits); err != nil {
			return decline(err)
		}
	default:
		state, err := loadState(statePath)
		if err != nil {
			return decline(diag.New(diag.SiloStateUnavailable, subject, "the client state cannot be read: %v", err).
				WithHelp("check %s; the silo does not train from a damaged state", statePath))
		}
		seed := fl.ClientSeed(st.Run, st.Round, b.Seed, a.Name)
		strategy = strategy.With(map[string]any{
			"round": int64(b.TrainRound), "seed": fl.ClientParamSeed(seed),
			"work": workOf(b, a.Name), "sites": int64(sites),
		})
		if spec.Spec.Buffer > 0 {
			// FedBuff's client scales its update by s(staleness) itself:
			// the server never sees an individual update to weight.
			strategy = strategy.With(map[string]any{"staleness": int64(staleness)})
		}
		if spec.Trainer != "" {
			out, err = a.trainWithTrainer(ctx, &spec, global, strategy, req.Privacy, subject) // trainer.go
		} else {
			env := script.Env{Catalog: a.Catalog, Seed: seed[:]}
			out, err = fl.ClientStep(ctx, env, strategy, global, train, state, req.Privacy)
		}
		if err != nil {
			if ctx.Err() != nil {
				return rec, ctx.Err()
			}
			return decline(err)
		}
		update, weight := out.Update, out.Weight
		if update == nil {
			if req.Privacy.Unit != fl.UnitNone {
				// Under DP every participant's weight is 1, so the summed weight
				// is the public participant count; a site the content declines
				// stays out rather than sending a zero weight into the sum.
				return decline(diag.New(diag.FLContract, subject, "the client step declined the round (no update)").
					WithHelp("under differential privacy a site either releases an update of weight 1 or takes no part"))
			}
			update, weight = make([]float64, b.UpdateDim), 0 // declined by the content: zeros
		}
		if len(update) != b.UpdateDim {
			return decline(diag.New(diag.FLDimension, subject, "the client step returned %d values; the round sums %d", len(update), b.UpdateDim).
				WithHelp("the run's model and the silo's dataset disagree on the number of features"))
		}
		in.Weight = weight
		if out.Encoded != nil {
			// Under DP the update leaves as the integers it was noised (or
			// rounded) on; nothing else is summed with it (checkRelease).
			in.Encoded = out.Encoded
			break
		}
		if held != nil && slices.Contains(b.Metrics, fl.EvalMetrics[0]) {
			// The incoming global model on rows it never trained on (DP
			// off: under DP only the charged evaluation step reports them).
			m, err := fl.EvalSums(spec.ModelSpec(), weights(global), held)
			if err != nil {
				return decline(err)
			}
			if out.Metrics == nil {
				out.Metrics = map[string]float64{}
			}
			maps.Copy(out.Metrics, m)
		}
		in.Values = b.Pack(update, out.Metrics)
	}
	weight := in.Weight
	if c, err := secagg.NewClient(b.SecAgg, a.Name, a.ID.PrivateKey()); err != nil {
		return decline(err)
	} else if in.Encoded != nil {
		if err := c.CheckEncoded(in.Encoded, weight); err != nil {
			return decline(err) // refused before the charge: nothing was paid for
		}
	} else if err := c.CheckInput(in.Values, weight); err != nil {
		return decline(err) // refused before the charge: nothing was paid for
	}
	if err := a.checkHE(b, in); err != nil {
		return decline(err) // refused before the charge: nothing was paid for
	}
	if kx != nil {
		if err := kx.over(); err != nil {
			return failed(err) // nothing cached, nothing charged
		}
	}
	// Law 12: what is released for this round is kept, durably, before it
	// is paid for; a retried round re-sends it (resend) instead of
	// training and noising again. Cached at the point of release: input
	// and weight are exactly what secure aggregation receives.
	stateBytes, err := fl.EncodeState(out.State)
	if err != nil {
		return decline(err)
	}
	// The release cache and the charge's outbox entry are two files, each
	// written durably before the charge; they do not depend on each other,
	// so they are written at once (one fsync wait on the round's path, not
	// two in a row).
	var outboxErr error
	var wrote sync.WaitGroup
	if len(out.Mechanism.Mechanisms) > 0 {
		// The charge's record goes to the outbox first: if the silo dies
		// between the charge and its report, it reports it when it starts.
		wrote.Go(func() { outboxErr = a.outboxPut(outboxEntry{Consumer: consumer, Record: rec}) })
	}
	err = a.saveReleased(released{Format: releasedFormat, Run: st.Run, Round: st.Round, Global: from,
		Values: in.Values, Encoded: in.Encoded, Weight: in.Weight, State: stateBytes})
	wrote.Wait()
	if err != nil {
		if len(out.Mechanism.Mechanisms) > 0 && outboxErr == nil {
			// No charge follows: the entry must not outlive this attempt
			// (a later attempt of the round, under another job, may charge
			// the same consumer).
			a.outboxDone(g.Job, g.Shard, false)
		}
		err = fmt.Errorf("caching the round's release: %w", err)
		if kx != nil {
			return failed(err) // nothing charged; the round goes on without this silo
		}
		return rec, err // nothing charged: retry
	}
	if outboxErr != nil {
		err := fmt.Errorf("writing the round's outbox entry: %w", outboxErr)
		if kx != nil {
			return failed(err) // nothing charged; the round goes on without this silo
		}
		return rec, err // nothing charged: retry
	}
	if a.Logf != nil { // the digest hashes the whole release: only for a log that shows it
		a.logf("%s: cached the round's release %s", subject, releaseDigest(in))
	}
	if len(evalMechs) > 0 {
		if spec.Spec.Eval.Dataset == "" {
			out.Mechanism.Mechanisms = append(out.Mechanism.Mechanisms, evalMechs...)
		} else {
			// The held-out rows are another dataset's: its own budget pays.
			e, err := a.Ledger.Charge(dp.ChargeRequest{Dataset: spec.Spec.Eval.Dataset, Consumer: consumer + "-eval", Mechanisms: evalMechs})
			if err != nil {
				return decline(err)
			}
			a.anchorLedger()
			a.logf("%s: charged evaluation dataset %s ε = %.6g, ledger entry %s", subject, spec.Spec.Eval.Dataset, e.Charge.Epsilon, e.Hash.Short())
		}
	}

	// Law 6: charge (fsync'd) before anything leaves the process.
	if len(out.Mechanism.Mechanisms) > 0 {
		e, err := a.Ledger.Charge(dp.ChargeRequest{Dataset: req.Dataset, Consumer: consumer, Mechanisms: out.Mechanism.Mechanisms})
		if err != nil {
			return decline(err) // an overdraft raced in: nothing leaves
		}
		a.anchorLedger()
		rec.LedgerEntry, rec.Mechanisms, rec.Epsilon = e.Hash, e.Charge.Mechanisms, e.Charge.Epsilon
		a.logf("%s: charged dataset %s ε = %.6g (cumulative %.6g), ledger entry %s", subject, req.Dataset, e.Charge.Epsilon, e.Charge.Cumulative, e.Hash.Short())
		if testfault.Armed(testfault.KillAfterCharge) {
			a.logf("%s: test fault %s: the charge is durable; killing the process", subject, testfault.KillAfterCharge)
			testfault.Kill()
		}
	}
	release() // paid (or nothing to pay): a retry now finds the charge
	if ctx.Err() != nil {
		rec.Status, rec.Refusals = Failed, refusalsOf(ctx.Err())
		a.logRefusal(subject, ctx.Err())
		return rec, nil
	}
	var base string
	if kx != nil {
		base, err = kx.give(in) // the charge is durable: the update may leave
	} else {
		if base, err = a.secaggHost(ctx, b); err == nil {
			err = a.participate(ctx, base, b, in)
		}
	}
	clear(in.Values)
	clear(in.Encoded)
	if err != nil {
		rec.Status, rec.Refusals = Failed, refusalsOf(err)
		a.logRefusal(subject+": secure aggregation", err)
		return rec, nil
	}
	if b.Step == "" || b.Step == fl.StepTrain {
		if err := saveState(statePath, out.State); err != nil {
			a.logf("%s: saving the client state: %v", subject, err)
		}
	}
	rec.Status = Contributed
	a.countRound("contributed")
	a.logf("%s: contributed (secure aggregation round %s on %s, %s)", subject, b.SecAgg.Round, base, aggMode(b))
	return rec, nil
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

// logRefusal writes the full diagnostics of a declined or failed round to
// the silo's own log: they may quote the silo's records, so they never
// leave the site (the contribution record carries codes only).
func (a *Appliance) logRefusal(subject string, err error) {
	a.countRound("declined")
	if ds, ok := diag.As(err); ok {
		for _, d := range ds {
			if d.Help != "" {
				a.logf("%s: declined: %s %s (%s)", subject, d.Code, d.Message, d.Help)
			} else {
				a.logf("%s: declined: %s %s", subject, d.Code, d.Message)
			}
		}
		return
	}
	a.logf("%s: declined: %v", subject, err)
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

// resend takes part in a retried round the silo already paid for: it
// re-sends, into the new secure aggregation, exactly the input and weight
// it released for this round before (cached at release), and charges
// nothing. Without the cache, or if the round now starts from another
// model, it declines: a second, different update would be a second
// release of the same round.
func (a *Appliance) resend(ctx context.Context, rec Contribution, b fl.RoundBundle, paid *dp.Entry, subject string) (Contribution, error) {
	rec.LedgerEntry, rec.Mechanisms, rec.Epsilon = paid.Hash, paid.Charge.Mechanisms, paid.Charge.Epsilon
	once := func(why string) (Contribution, error) {
		err := diag.New(diag.RunBadRound, subject, "the ledger already holds a charge for this round (entry %s) and %s", paid.Hash.Short(), why).
			WithHelp("a round is paid for and sent at most once; it goes on without this silo")
		// The charge stands (an earlier attempt paid it): the record
		// names it, so it is visible and accounted even though nothing is
		// sent this time.
		rec.Status, rec.Refusals = Declined, refusalsOf(err)
		a.logRefusal(subject, err)
		return rec, nil
	}
	rel, err := a.loadReleased(rec.Run, rec.Round)
	from, _ := b.BaseOf(a.Name)
	switch {
	case err != nil:
		return once(fmt.Sprintf("its release cannot be re-sent: %v", err))
	case rel.Global != from:
		return once(fmt.Sprintf("the round now starts from model %s, not %s that the paid update was trained from", from.Short(), rel.Global.Short()))
	case len(rel.Values)+len(rel.Encoded) != b.SecAgg.Dim || (rel.Encoded != nil) != (b.SecAgg.GridBits > 0):
		return once(fmt.Sprintf("the round sums %d values (grid bits %d), the paid release has %d float and %d grid values",
			b.SecAgg.Dim, b.SecAgg.GridBits, len(rel.Values), len(rel.Encoded)))
	}
	in := wire.Input{Values: rel.Values, Encoded: rel.Encoded, Weight: rel.Weight, MinSurvivors: max(a.Policy.MinCohort, secagg.MinSites)}
	digest := releaseDigest(in)
	// The retried round may have another cohort: the release must still
	// fit its ring (the same checks as before the charge).
	c, err := secagg.NewClient(b.SecAgg, a.Name, a.ID.PrivateKey())
	if err == nil {
		if in.Encoded != nil {
			err = c.CheckEncoded(in.Encoded, in.Weight)
		} else {
			err = c.CheckInput(in.Values, in.Weight)
		}
	}
	if err == nil {
		err = a.checkHE(b, in)
	}
	if err != nil {
		return once(fmt.Sprintf("its paid release does not fit the retried round: %v", err))
	}
	base, err := a.secaggHost(ctx, b)
	if err == nil {
		err = a.participate(ctx, base, b, in)
	}
	clear(rel.Values)
	clear(rel.Encoded)
	if err != nil {
		rec.Status, rec.Refusals = Failed, refusalsOf(err)
		a.logRefusal(subject+": secure aggregation (re-sent release)", err)
		return rec, nil
	}
	if state, err := fl.DecodeState(rel.State); err == nil {
		path, err := a.statePath(rec.Run)
		if err == nil {
			err = saveState(path, state)
		}
		if err != nil {
			a.logf("%s: saving the client state: %v", subject, err)
		}
	}
	rec.Status = Contributed
	a.countRound("resent")
	a.logf("%s: re-sent the update already paid for (release %s, ledger entry %s; nothing charged) to secure aggregation round %s on %s",
		subject, digest, paid.Hash.Short(), b.SecAgg.Round, base)
	return rec, nil
}

// strategy returns the run's strategy: the silo's own entry when it has
// that content, else the blob of that ref parsed as a catalog entry (it
// is not added to the silo's catalog). The policy already accepted it.
func (a *Appliance) strategy(ctx context.Context, spec fl.Canonical) (*fl.Strategy, error) {
	if e, ok := a.Catalog.Lookup(string(spec.Strategy)); ok {
		return fl.NewStrategy(e, spec.Params())
	}
	src, err := a.runBlob(ctx, spec.Strategy)
	if err != nil {
		return nil, retryable{fmt.Errorf("fetching strategy %s: %w", spec.Strategy.Short(), err)}
	}
	name := spec.Spec.Strategy
	if name == "" || catalog.IsPath(name) {
		name = "strategy"
	}
	e, err := catalog.Parse(name+".star", src)
	if err != nil {
		return nil, err
	}
	return fl.NewStrategy(e, spec.Params())
}

// workOf is the fraction of its local work the round lets this silo do:
// the bundle's figure for a straggler, else all of it.
func workOf(b fl.RoundBundle, name string) float64 {
	if w, ok := b.Work[name]; ok && w > 0 && w <= 1 {
		return w
	}
	return 1.0
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

// report uploads the signed record and reports its hash for the shard.
// A round that charged has an outbox entry: the signed record goes into it
// (durably) before its hash is reported — written while the record's bytes
// are uploaded, which needs no wait for it (issue 19: a record uploaded
// but not reported is no report; a silo that dies then reports, when it
// starts, the record its outbox holds) — and the entry is removed once the
// pool has it; a record the pool could not be reached for stays there, and
// is delivered when the silo next starts (outbox.go).
func (a *Appliance) report(g coordinator.LeaseGrant, rec Contribution) error {
	a.anchor(&rec)
	signed, err := Sign(a.ID, rec)
	if err != nil {
		return err
	}
	b, err := content.Encode(signed)
	if err != nil {
		return err
	}
	e, err := a.outboxGet(g.Job, g.Shard)
	queued := err == nil
	wrote := make(chan struct{})
	if queued {
		e.Record, e.Signed = rec, b
		go func() {
			defer close(wrote)
			if err := a.outboxPut(e); err != nil {
				a.logf("run %s round %d: writing the record into the outbox: %v", rec.Run.Short(), rec.Round, err)
			}
		}()
	} else {
		close(wrote)
		if !errors.Is(err, fs.ErrNotExist) {
			a.logf("run %s round %d: reading the outbox: %v", rec.Run.Short(), rec.Round, err)
		}
	}
	inOutbox := func() error { <-wrote; return nil }
	err = a.deliverSigned(context.Background(), g, rec, b, inOutbox)
	inOutbox() // also when the upload failed: the entry is not touched twice at once
	if queued && (err == nil || finalRefusal(err)) {
		a.outboxDone(g.Job, g.Shard, true)
	}
	return err
}

// anchor records the ledger's head and the dataset's bookkeeping in rec.
// A ledger that cannot be read (fenced) leaves rec without an anchor.
func (a *Appliance) anchor(rec *Contribution) {
	snap, err := a.Ledger.Snapshot()
	if err != nil {
		a.logf("run %s round %d: the ledger cannot be read for the record's anchor: %v", rec.Run.Short(), rec.Round, err)
		return
	}
	rec.LedgerSeq, rec.LedgerHead = uint64(snap.Len()-1), snap.Head()
	if st, ok := snap.Dataset(rec.Dataset); ok && rec.Dataset != "" {
		rec.Delta, rec.Cumulative, rec.Budget = st.Delta, st.Spent, st.Budget
	}
}

// statePath is where the client state of a run is kept. The run ID
// becomes a folder name, so it is validated here (law 14) whatever decoded
// it: only sha256:<64 lowercase hex> names a folder.
func (a *Appliance) statePath(run content.Ref) (string, error) {
	if !content.IsRef(string(run)) {
		return "", fmt.Errorf("the run ID is not a ref (sha256:<64 lowercase hex digits>)")
	}
	return filepath.Join(a.Config.DataDir, run.Hex(), "state"), nil
}

func loadState(path string) (map[string]any, error) {
	b, err := safefile.ReadFile(path, safefile.MaxLedger)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return fl.DecodeState(b)
}

// saveState writes the state's canonical encoding atomically and durably,
// unless the file already holds it (only writeDurable writes it, so what
// it holds is durable) or there is no state and none is kept (loadState
// reads a missing file as no state): a strategy without client state, or
// with one that did not change, costs no fsync per round.
func saveState(path string, state map[string]any) error {
	b, err := fl.EncodeState(state)
	if err != nil {
		return err
	}
	switch old, err := safefile.ReadFile(path, safefile.MaxLedger); {
	case err == nil && bytes.Equal(old, b):
		return nil
	case errors.Is(err, os.ErrNotExist) && state == nil:
		return nil
	}
	return writeDurable(path, b, 0o600)
}
