package silo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/secagg/wire"
)

// roundAttempt is one attempt at a round: what each phase learns and the
// phases after it use. A phase fills in its own part and says how the
// attempt ends by the error it returns (see finish).
type roundAttempt struct {
	a       *Appliance
	g       coordinator.LeaseGrant
	st      coordinator.JobStatus
	rec     Contribution // the record to report
	subject string       // "run R round N", for diagnostics and the log

	// admit
	b          fl.RoundBundle // this silo's part of the round (ForSite)
	sites      int            // the whole cohort's size (a tree's too)
	spec       fl.Canonical
	req        RoundRequest
	from       content.Ref // the model this silo trains from
	staleness  int
	specBlob   func() ([]byte, error)
	globalBlob func() ([]byte, error)
	stopGlobal context.CancelFunc
	parentOK   func() error // the parent cluster's verdict on the round
	now        time.Time
	consumer   string    // the ledger's consumer of the round's charge
	unlock     func()    // ends the round's lock; safe to call twice
	paid       *dp.Entry // an earlier attempt's charge: the round is re-sent

	// prepare
	journaled    func() // waits for the round log's fsync
	strategy     *fl.Strategy
	kx           *keyExchange
	minSurvivors int
	global       fl.Global
	rows, held   *model.Dataset // the training and held-out rows
	statePath    string

	// train
	in        wire.Input
	out       fl.ClientOutput
	evalMechs []dp.Mechanism // held-out metrics: charged to the evaluation dataset when it is a separate one
	keepState bool           // record saves out.State as the run's client state

	// contribute
	base   string      // the host of the round's secure aggregation
	digest content.Ref // a re-sent release's digest, for the log
}

func (a *Appliance) newAttempt(g coordinator.LeaseGrant, st coordinator.JobStatus) *roundAttempt {
	return &roundAttempt{
		a: a, g: g, st: st,
		rec:     Contribution{Format: ContributionFormat, Run: st.Run, Round: st.Round, Job: g.Job, Shard: g.Shard, Silo: a.Name},
		subject: fmt.Sprintf("run %s round %d", st.Run.Short(), st.Round),
		unlock:  func() {},
	}
}

// An attempt ends in one of four ways, which the phases tell by the error
// they return:
//   - nil: the silo contributed (or re-sent what it paid for);
//   - declineErr: the silo takes no part; the record says why;
//   - failErr: the silo took part (its keys, or its charge, are in the
//     round) but its part failed; the record says why;
//   - any other error: nothing was charged or sent, and the lease is
//     handed back to be retried.
type (
	declineErr struct{ error }
	failErr    struct {
		error
		in string // what failed, appended to the subject in the log
	}
)

func decline(err error) error { return declineErr{err} }

func fail(err error) error { return failErr{error: err} }

// bad is the diagnostic of a round job that does not fit its run.
func (at *roundAttempt) bad(format string, args ...any) error {
	return diag.New(diag.RunBadRound, at.subject, format, args...).
		WithHelp("the round job does not fit its run; the silo takes no part in it")
}

// unsent is the end of an attempt that charged nothing: handed back to be
// retried, unless the silo's keys are in the round's key exchange (a retry
// would bring other keys into it), when the round goes on without it.
func (at *roundAttempt) unsent(err error) error {
	if at.kx != nil {
		return fail(err)
	}
	return err
}

// finish turns the phases' verdict into the record to report, or the
// error that hands the lease back.
func (at *roundAttempt) finish(err error) (Contribution, error) {
	switch e := err.(type) {
	case nil:
		return at.rec, nil
	case declineErr:
		at.rec.Status, at.rec.Refusals = Declined, refusalsOf(e.error)
		at.a.logRefusal(at.subject, e.error)
		return at.rec, nil
	case failErr:
		at.rec.Status, at.rec.Refusals = Failed, refusalsOf(e.error)
		at.a.logRefusal(at.subject+e.in, e.error)
		return at.rec, nil
	}
	return at.rec, err
}

// close ends what the attempt started: the key exchange (a round that
// ends without an update stops it before it is reported), the round log's
// fsync (waited for: a decline is reported only after it), the round's
// lock and the global model's fetch.
func (at *roundAttempt) close() {
	if at.kx != nil {
		at.kx.drop()
	}
	if at.journaled != nil {
		at.journaled()
	}
	at.unlock()
	if at.stopGlobal != nil {
		at.stopGlobal()
	}
}

// lock takes the round's lock (lockRound) until at.unlock.
func (at *roundAttempt) lock(ctx context.Context) error {
	unlock, err := at.a.lockRound(ctx, at.consumer)
	if err != nil {
		return err
	}
	var once sync.Once
	at.unlock = func() { once.Do(unlock) }
	return nil
}
