package silo

import (
	"context"
	"fmt"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// prepare gets an admitted round ready to train: it notes the round in
// the round log, loads the strategy, starts the key exchange, and reads
// the global model and the run's data (its standardisation applied). From
// here on a decline still counts against the daily limit.
func (at *roundAttempt) prepare(ctx context.Context) error {
	a, b := at.a, at.b
	// The journal's fsync runs while the strategy and the global model
	// are fetched; it is waited for before the run's data is read, and
	// before the round returns (close).
	at.journaled = a.startRecordRound(at.req.Key(), at.now)
	var err error
	if at.strategy, err = a.strategy(ctx, at.spec); err != nil {
		if _, ok := diag.As(err); ok {
			return decline(err)
		}
		return err
	}
	// A buffered-asynchronous run's silo trains from the version it last
	// fetched (RoundBundle.Base); every other round from the bundle's.
	if at.staleness < 0 {
		return decline(at.bad("staleness %d is negative", at.staleness))
	}
	// The key exchange of secure aggregation starts now, while the silo
	// receives the global model, trains, caches and charges; the update
	// joins it only once charged (keyExchange.give). It starts before the
	// global model is in (issue 19: the slowest silo's advert, and with it
	// the whole exchange, waited for that fetch): the advert carries
	// nothing of the model or the update. From here on nothing hands the
	// lease back to be retried (unsent): this silo's keys are in the
	// round, and a retry would bring other keys into it.
	at.minSurvivors = max(a.Policy.MinCohort, secagg.MinSites)
	at.kx = a.startKeyExchange(ctx, b, at.minSurvivors)
	raw, err := at.globalBlob()
	if err != nil {
		err = fmt.Errorf("fetching the global model: %w", err)
		if ctx.Err() != nil {
			return err // the attempt was abandoned
		}
		return at.unsent(err)
	}
	if at.global, err = fl.DecodeGlobal(raw); err != nil {
		return decline(at.bad("the global model %s cannot be decoded: %v", at.from.Short(), err))
	}
	at.journaled() // the data is read from here on
	if at.rows, at.held, err = a.runData(at.st.Run, &at.spec, &at.b); err != nil {
		return decline(err)
	}
	if at.statePath, err = a.statePath(at.st.Run); err != nil {
		return decline(at.bad("%v", err))
	}
	return nil
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
