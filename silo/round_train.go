package silo

import (
	"context"
	"maps"
	"slices"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg/wire"
)

// train computes what the round sums from this silo: the step's feature
// statistics, held-out metrics or model update, with its weight, in
// at.in. Under DP the statistics and metrics are released (noised on the
// grid) here, and an update by the client step; release charges them.
func (at *roundAttempt) train(ctx context.Context) error {
	// What train read and computed besides at.in is not needed after it:
	// the global model and the step's float update (at.in holds what
	// leaves) are let go before release caches and masks, not held, at a
	// model's bytes each, through the rest of the round (issue 32).
	defer func() { at.global, at.out.Update = nil, nil }()
	at.in = wire.Input{MinSurvivors: at.minSurvivors}
	var err error
	switch at.b.Step {
	case fl.StepStats:
		return at.trainStats()
	case fl.StepEval:
		at.in.Weight = 1
		if at.spec.Trainer != "" {
			// The run's own trainer scores the model (trainer.go).
			at.in.Values, at.in.Encoded, at.evalMechs, err = at.a.evalWithTrainer(ctx, at.st.Run, &at.spec, at.global, at.b.TrainRound, at.req.Privacy, at.b.SecAgg.GridBits, at.subject)
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				return decline(err)
			}
			return nil
		}
		if at.in.Values, at.in.Encoded, at.evalMechs, err = heldOut(&at.spec, at.global, at.held, at.req.Privacy, at.b.SecAgg.GridBits); err != nil {
			return decline(err)
		}
		return nil
	}
	at.keepState = at.b.Step == "" || at.b.Step == fl.StepTrain
	return at.trainModel(ctx)
}

// trainStats sums the feature statistics: Σx, Σx² and the row count of
// the training rows; with DP on, each row scaled by the run's public
// feature bounds and the sums released on the grid, noised and charged
// (the count exact when the run and the dataset make it public).
func (at *roundAttempt) trainStats() error {
	at.in.Weight = 1
	if at.req.Privacy.Unit == fl.UnitNone {
		sums, rows := fl.StatsVector(at.rows)
		at.in.Values = append(sums, rows)
		return nil
	}
	bounds := at.spec.Spec.Bounds()
	if bounds.Len() != at.rows.Dims() {
		return decline(diag.New(diag.ModelNoStatistics, at.subject, "the run's DP is on but it gives %d feature bounds for %d features", bounds.Len(), at.rows.Dims()).
			WithHelp("a value's range must be bounded for the statistics' noise to mean anything; the run author sets privacy.feature_bounds"))
	}
	var err error
	if at.in.Encoded, at.out.Mechanism.Mechanisms, err = at.req.Privacy.ReleaseStats(at.rows, bounds, at.spec.Spec.PublicRows, at.b.SecAgg.GridBits); err != nil {
		return decline(err)
	}
	return nil
}

// trainModel runs the strategy's client step (fl.ClientStep) from the
// run's client state and packs its update, with training metrics when
// the round sums them.
func (at *roundAttempt) trainModel(ctx context.Context) error {
	a, b, st := at.a, at.b, at.st
	state, err := loadState(at.statePath)
	if err != nil {
		return decline(diag.New(diag.SiloStateUnavailable, at.subject, "the client state cannot be read: %v", err).
			WithHelp("check %s; the silo does not train from a damaged state", at.statePath))
	}
	seed := fl.ClientSeed(st.Run, st.Round, b.Seed, a.Name)
	strategy := at.strategy.With(map[string]any{
		"round": int64(b.TrainRound), "seed": fl.ClientParamSeed(seed),
		"work": workOf(b, a.Name), "sites": int64(at.sites),
	})
	if at.spec.Spec.Buffer > 0 {
		// FedBuff's client scales its update by s(staleness) itself:
		// the server never sees an individual update to weight.
		strategy = strategy.With(map[string]any{"staleness": int64(at.staleness)})
	}
	if at.spec.Trainer != "" {
		// The run's own trainer (trainer.go) in place of the strategy's
		// client step: its update is released below as any other.
		at.out, err = a.trainWithTrainer(ctx, at.st.Run, &at.spec, at.global, strategy, at.req.Privacy, at.subject)
	} else {
		env := script.Env{Catalog: a.Catalog, Seed: seed[:]}
		at.out, err = fl.ClientStep(ctx, env, strategy, at.global, at.rows, state, at.req.Privacy)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return decline(err)
	}
	update, weight := at.out.Update, at.out.Weight
	if update == nil {
		if at.req.Privacy.Unit != fl.UnitNone {
			// Under DP every participant's weight is 1, so the summed weight
			// is the public participant count; a site the content declines
			// stays out rather than sending a zero weight into the sum.
			return decline(diag.New(diag.FLContract, at.subject, "the client step declined the round (no update)").
				WithHelp("under differential privacy a site either releases an update of weight 1 or takes no part"))
		}
		update, weight = make([]float64, b.UpdateDim), 0 // declined by the content: zeros
	}
	if len(update) != b.UpdateDim {
		return decline(diag.New(diag.FLDimension, at.subject, "the client step returned %d values; the round sums %d", len(update), b.UpdateDim).
			WithHelp("the run's model and the silo's dataset disagree on the number of features"))
	}
	at.in.Weight = weight
	if at.out.Encoded != nil {
		// Under DP the update leaves as the integers it was noised (or
		// rounded) on; nothing else is summed with it (checkRelease).
		at.in.Encoded = at.out.Encoded
		return nil
	}
	return at.pack(update)
}

// pack puts the update into the summed vector with the round's training
// metrics (DP off): among them the incoming global model's on rows it
// never trained on, when the round asks for them.
func (at *roundAttempt) pack(update []float64) error {
	if at.held != nil && slices.Contains(at.b.Metrics, fl.EvalMetrics[0]) {
		// Under DP only the charged evaluation step reports them.
		m, err := fl.EvalSums(at.spec.ModelSpec(), weights(at.global), at.held)
		if err != nil {
			return decline(err)
		}
		if at.out.Metrics == nil {
			at.out.Metrics = map[string]float64{}
		}
		maps.Copy(at.out.Metrics, m)
	}
	at.in.Values = at.b.Pack(update, at.out.Metrics)
	return nil
}

// workOf is the fraction of its local work the round lets this silo do:
// the bundle's figure for a straggler, else all of it.
func workOf(b fl.RoundBundle, name string) float64 {
	if w, ok := b.Work[name]; ok && w > 0 && w <= 1 {
		return w
	}
	return 1.0
}
