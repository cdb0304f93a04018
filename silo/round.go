package silo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/safefile"
)

// HandleRound takes part in one round for a leased shard of a round job,
// in phases (round, one file each):
//
//  1. admit (round_admit.go): fetch the round bundle and the run spec
//     (blobs, by hash) and check the round with the parent cluster and
//     against the policy, the ledger and the round log (Policy.CheckRound,
//     every refusal at once) before anything else;
//  2. prepare (round_prepare.go): fetch the strategy and the global model,
//     start the key exchange, read the run's dataset (standardised);
//  3. train (round_train.go): run fl.ClientStep with the dataset's unit of
//     privacy (client state from DATA_DIR/<run>/state), or the step's
//     statistics or held-out metrics;
//  4. release (round_release.go): cache the release, then charge the
//     ledger with the step's mechanism (fsync'd) — only then
//  5. contribute (round_contribute.go): take part in secure aggregation,
//     masked or encrypted, with the packed update and weight;
//  6. record (round_record.go): save the new client state; HandleRound
//     then uploads a signed Contribution and reports its hash for the
//     shard.
//
// A retried round this silo already paid for re-sends its cached release
// (round_resend.go) in place of steps 2–4.
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

// round runs one attempt at the round as a sequence of phases, and
// returns the contribution record to report, or an error when nothing was
// charged and the shard should be retried (roundAttempt.finish):
//
//	admit → prepare → train → release → contribute → record
//
// A round an earlier attempt already paid for (a retry) is one state, not
// a branch in every phase: admit finds the charge, and restore takes the
// place of prepare, train and release.
func (a *Appliance) round(ctx context.Context, g coordinator.LeaseGrant, st coordinator.JobStatus) (Contribution, error) {
	at := a.newAttempt(g, st)
	defer at.close()
	return at.finish(at.run(ctx))
}

func (at *roundAttempt) run(ctx context.Context) error {
	if err := at.admit(ctx); err != nil {
		return err
	}
	phases := []func(context.Context) error{at.prepare, at.train, at.release, at.contribute}
	if at.paid != nil {
		phases = []func(context.Context) error{at.restore, at.contribute}
	}
	for _, phase := range phases {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	at.record()
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
