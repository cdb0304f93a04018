package silo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Every charge is listed (law 11: a release is paid for at its true price,
// and the price is visible). A silo reports the signed record of a round
// after it took part; a silo killed between charging its ledger and
// reporting would leave a charge no member can see. The outbox closes that
// gap. Before a round's charge, the silo writes an entry
// DATA_DIR/outbox/<job hex>-<shard> (written and fsync'd like the ledger:
// temporary file, fsync, rename, folder fsync) holding the round's record
// as it stands and the ledger consumer the charge will name. report writes
// the signed record into the entry while it uploads the record's bytes,
// reports the record's hash only once the entry holds it durably, and
// removes the entry once the pool has it. When the silo starts (Run), it delivers
// every entry left over before it leases anything:
//
//   - an entry with its signed record: those bytes, as they are (the pool
//     takes a peer's report for a shard once and answers the same report
//     again like the first time, so a record delivered just before the
//     crash is not counted twice);
//   - an entry without one, whose consumer's charge is in the ledger: a
//     record of status failed naming that charge (SiloRestarted), signed,
//     written into the entry, then delivered — the silo died after paying
//     and before its round completed;
//   - an entry without one and no charge in the ledger: dropped (the silo
//     died before paying; nothing to list).
//
// The pool accepts a record for a shard the silo once held a lease on,
// late or not (coordinator report rules), also when the round was reduced
// without it or its attempt abandoned; `scellis privacy report` lists it
// from the job's shard reports.

// outboxFormat versions an outbox entry.
const outboxFormat = "scellis/silo-outbox/v1"

// outboxDir is the outbox's folder in data_dir.
const outboxDir = "outbox"

// outboxEntry is one round attempt's undelivered record.
type outboxEntry struct {
	Format   string       `cbor:"format"`
	Consumer string       `cbor:"consumer"` // the ledger consumer the charge names
	Record   Contribution `cbor:"record"`
	// Signed is the signed record's canonical encoding, once made: what
	// is delivered, byte for byte, however often.
	Signed []byte `cbor:"signed,omitempty"`
}

// outboxPath is the entry of one shard of a round job. The job ID becomes
// a file name, so it is validated here (law 14).
func (a *Appliance) outboxPath(job content.Ref, shard int) (string, error) {
	if !content.IsRef(string(job)) || shard < 0 {
		return "", fmt.Errorf("outbox entry for job %q shard %d: not a job ref", job, shard)
	}
	return filepath.Join(a.Config.DataDir, outboxDir, fmt.Sprintf("%s-%d", job.Hex(), shard)), nil
}

// outboxPut writes e durably, replacing the shard's entry.
func (a *Appliance) outboxPut(e outboxEntry) error {
	path, err := a.outboxPath(e.Record.Job, e.Record.Shard)
	if err != nil {
		return err
	}
	e.Format = outboxFormat
	b, err := content.Encode(&e)
	if err != nil {
		return err
	}
	return writeDurable(path, b, 0o600)
}

// outboxGet reads the entry of a shard; os.ErrNotExist when there is none.
func (a *Appliance) outboxGet(job content.Ref, shard int) (outboxEntry, error) {
	path, err := a.outboxPath(job, shard)
	if err != nil {
		return outboxEntry{}, err
	}
	return readOutbox(path)
}

func readOutbox(path string) (outboxEntry, error) {
	var e outboxEntry
	b, err := safefile.ReadFile(path, safefile.MaxLedger)
	if err != nil {
		return e, err
	}
	if err := content.Decode(b, &e); err != nil {
		return e, fmt.Errorf("the outbox entry %s is damaged: %w", path, err)
	}
	if e.Format != outboxFormat || e.Record.Format != ContributionFormat {
		return e, fmt.Errorf("the outbox entry %s has format %q, want %q", path, e.Format, outboxFormat)
	}
	if filepath.Base(path) != fmt.Sprintf("%s-%d", strings.TrimPrefix(string(e.Record.Job), "sha256:"), e.Record.Shard) {
		return e, fmt.Errorf("the outbox entry %s names job %s shard %d", path, e.Record.Job.Short(), e.Record.Shard)
	}
	return e, nil
}

// outboxDone removes the entry of a shard: durably, unless the entry
// held a signed record the pool has taken (delivered). Such an entry,
// back after a crash, is only delivered again, byte for byte, and the
// pool answers it as the first time; sparing the folder's fsync keeps it
// off every round (issue 19). An entry that never held a delivered
// record is removed durably: back after a crash, it could name a charge
// that a later attempt of the round made.
func (a *Appliance) outboxDone(job content.Ref, shard int, delivered bool) {
	path, err := a.outboxPath(job, shard)
	if err == nil {
		err = os.Remove(path)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
	}
	if err == nil && !delivered {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		a.logf("removing the outbox entry of job %s shard %d: %v", job.Short(), shard, err)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// finalRefusal reports whether the pool refused a record for good (the
// job or shard is unknown, the silo never held it, it already reported
// another record): delivering it again cannot succeed.
func finalRefusal(err error) bool {
	ds, ok := diag.As(err)
	if !ok {
		return false
	}
	return slices.ContainsFunc(ds, func(d *diag.Diagnostic) bool {
		switch d.Code {
		case diag.PoolUnknownJob, diag.PoolUnknownShard, diag.PoolBadCommand, diag.PoolNoLease,
			diag.PoolReportConflict, diag.PoolRevealMismatch, diag.PoolPeerExcluded:
			return true
		}
		return false
	})
}

// deliverOutbox delivers every entry of the outbox, and returns how many
// are left to deliver (the pool could not be reached) and the last error.
func (a *Appliance) deliverOutbox(ctx context.Context) (int, error) {
	dir := filepath.Join(a.Config.DataDir, outboxDir)
	files, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	left := 0
	var last error
	for _, f := range files {
		if !f.Type().IsRegular() || strings.HasPrefix(f.Name(), ".") {
			continue // writeDurable's temporary files
		}
		e, err := readOutbox(filepath.Join(dir, f.Name()))
		if err != nil {
			// Kept for the operator: it may be the only trace of a charge.
			a.logf("outbox: %v; left in place", err)
			continue
		}
		if err := a.redeliver(ctx, e); err != nil {
			left++
			last = err
		}
	}
	return left, last
}

// redeliver delivers one leftover entry (see the top of this file).
func (a *Appliance) redeliver(ctx context.Context, e outboxEntry) error {
	rec := e.Record
	subject := fmt.Sprintf("run %s round %d", rec.Run.Short(), rec.Round)
	if e.Signed == nil {
		paid, err := a.chargedFor(e.Consumer)
		if err != nil {
			return err
		}
		if paid == nil {
			a.logf("%s: outbox: no charge was made before the silo stopped; nothing to report", subject)
			a.outboxDone(rec.Job, rec.Shard, false)
			return nil
		}
		rec.Status, rec.Refusals = Failed, refusalsOf(diag.New(diag.SiloRestarted, subject, "restarted"))
		rec.LedgerEntry, rec.Mechanisms, rec.Epsilon = paid.Hash, paid.Charge.Mechanisms, paid.Charge.Epsilon
		a.anchor(&rec)
		signed, err := Sign(a.ID, rec)
		if err != nil {
			return err
		}
		if e.Signed, err = content.Encode(signed); err != nil {
			return err
		}
		e.Record = rec
		if err := a.outboxPut(e); err != nil {
			return err
		}
	}
	err := a.deliverSigned(ctx, coordinator.LeaseGrant{Job: rec.Job, Shard: rec.Shard}, rec, e.Signed, nil)
	switch {
	case err == nil:
		a.logf("%s: outbox: delivered the record of ledger entry %s to job %s", subject, rec.LedgerEntry.Short(), rec.Job.Short())
	case finalRefusal(err):
		a.logf("%s: outbox: the pool refused the record of job %s shard %d for good: %v", subject, rec.Job.Short(), rec.Shard, err)
	default:
		return err
	}
	a.outboxDone(rec.Job, rec.Shard, true)
	return nil
}

// deliverSigned uploads a signed record and reports its hash for g's
// shard; ready, when set, is waited for between the two (pool.DeliverWhen).
func (a *Appliance) deliverSigned(ctx context.Context, g coordinator.LeaseGrant, rec Contribution, b []byte, ready func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ref := content.Hash(b)
	out, err := a.Worker().DeliverWhen(ctx, g, b, ref, ready)
	if err != nil {
		return err
	}
	a.logf("run %s round %d: reported %s contribution %s (%s)", rec.Run.Short(), rec.Round, rec.Status, ref.Short(), out.Outcome)
	return nil
}

// flushOutbox delivers the outbox's leftovers before the silo leases
// anything (a new attempt of the same shard must not report a second,
// different record for it), trying again with backoff while the pool
// cannot be reached — for outboxWait at most; what is still left then is
// delivered in the background.
func (a *Appliance) flushOutbox(ctx context.Context) {
	a.removeTemporaries(filepath.Join(a.Config.DataDir, outboxDir))
	deadline := time.Now().Add(outboxWait)
	wait := a.Poll
	for {
		left, err := a.deliverOutbox(ctx)
		if left == 0 {
			if err != nil {
				a.logf("outbox: %v", err)
			}
			return
		}
		if time.Now().After(deadline) {
			a.logf("outbox: %d record(s) not delivered yet (%v); trying again in the background", left, err)
			go a.flushOutboxLater(ctx, wait)
			return
		}
		if !sleepCtx(ctx, wait) {
			return
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// removeTemporaries removes what writeDurable left in dir when the
// process died between creating its temporary file and renaming it: the
// entry it was writing never existed (the rename is the write), so the
// file holds nothing anyone needs. Called at start, before this process
// writes anything there; the outbox would otherwise never be seen empty.
func (a *Appliance) removeTemporaries(dir string) {
	files, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, f := range files {
		if f.Type().IsRegular() && strings.HasPrefix(f.Name(), ".tmp-") {
			if err := os.Remove(filepath.Join(dir, f.Name())); err != nil {
				a.logf("outbox: removing an interrupted write's %s: %v", f.Name(), err)
			}
		}
	}
}

// outboxWait bounds how long a starting silo waits for its outbox.
const outboxWait = time.Minute

func (a *Appliance) flushOutboxLater(ctx context.Context, wait time.Duration) {
	for sleepCtx(ctx, wait) {
		if left, _ := a.deliverOutbox(ctx); left == 0 {
			return
		}
		wait = min(2*wait, 5*time.Minute)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
