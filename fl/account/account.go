// Package account is the one account of a training run's privacy cost:
// which round job produced each completed step, and every signed
// contribution record the silos reported to the run's round jobs, with
// each ledger charge counted once. `fl watch`, `fl model`, `fl plot`,
// `privacy report` and the Studio all read a run through it, so they
// cannot disagree on which silo paid what for which step.
//
// The invariant it keeps: a step's ε and declines come from the records
// of the round jobs that attempted that step — the job that produced it
// is the one its round result names, never the job at the same index of
// the run's job list (a retried round adds an abandoned job there) — and
// a charge is counted once however many records name its ledger entry (a
// retried round re-sends the update an abandoned attempt paid for).
// A running round job's undecided shards are not read (law 13): their
// reports are read once the job is reduced or abandoned.
package account

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/silo"
)

// Source is what an account is read from: the replicated job states and
// blobs by hash. An API client and an aggregator node's own replica both
// serve it. A Reader shared between goroutines calls them concurrently.
type Source interface {
	Job(ctx context.Context, id content.Ref) (coordinator.JobStatus, error)
	Blob(ctx context.Context, ref content.Ref) ([]byte, error)
}

// How a charge is proved.
const (
	// ByReceipt: the record is a round shard's decided result, which the
	// shard's receipt cites.
	ByReceipt = "receipt"
	// ByAbandoned: the record was reported to a round attempt the
	// aggregator abandoned (never reduced, so no receipt); it is in that
	// job's replicated shard reports.
	ByAbandoned = "abandoned"
	// ByLate: the record reached a round job already reduced without it
	// (a silo that stopped after paying delivers it from its outbox when
	// it starts again): no receipt; it is in that job's shard reports.
	ByLate = "late"
)

// Record is one signed contribution record reported to a round job of the
// run.
type Record struct {
	silo.Contribution
	// Ref is the record blob's hash; ReportedTo the round job it was
	// reported to (the record's own Job names the attempt it was made
	// for: a record a silo delivers late from its outbox goes to that
	// attempt, reduced or abandoned since).
	Ref        content.Ref
	ReportedTo content.Ref
	// Proof is ByReceipt, ByAbandoned or ByLate; Receipt the sequence
	// number of the receipt that cites it (ByReceipt; 0 when the job's
	// status names none).
	Proof   string
	Receipt uint64
	// Verified: the record carries a valid signature of the silo named in
	// it (federation file).
	Verified bool
}

// Step is one completed step (statistics, training round or evaluation)
// of a run.
type Step struct {
	Result *fl.RoundResult
	// Attempts are the round jobs that tried this step, in order; the
	// last produced it (Result.Job).
	Attempts []content.Ref
	// Summary is the step's row: metrics from its sums, ε charged per
	// silo for the step (by any attempt, each charge once) and the
	// refusals of the silos the producing job decided as declined or
	// failed.
	Summary fl.RoundSummary
	// SubmittedAt and DoneAt are the producing job's times (ms).
	SubmittedAt, DoneAt int64
}

// Global decodes the model state the step produced.
func (s Step) Global() (fl.Global, error) { return fl.DecodeGlobal(s.Result.Global) }

// Run is a run's whole account.
type Run struct {
	Status coordinator.RunStatus
	Steps  []Step
	// Records are every record of the run's round jobs: decided shards'
	// results, and the other reports of jobs that are over; in job and
	// shard order.
	Records []Record
	// Datasets are the charges composed per silo and dataset, sorted by
	// silo then dataset.
	Datasets []Dataset
}

// Reader reads accounts from a Source. It keeps what a hash fixes (round
// results, records and their signature checks), so one Reader kept across
// reads (the Studio's, a watch's) fetches each blob once. Safe for
// concurrent use.
type Reader struct {
	src Source
	fed *identity.Federation

	mu      sync.Mutex
	rounds  map[content.Ref]*fl.RoundResult
	records map[content.Ref]*signed // nil: the blob is no contribution record
	specs   map[content.Ref]*fl.Canonical
}

type signed struct {
	rec      silo.Contribution
	verified bool
}

// NewReader returns a Reader of src that checks records' signatures
// against fed (nil: none is checked, and none counts as verified).
func NewReader(src Source, fed *identity.Federation) *Reader {
	return &Reader{src: src, fed: fed, rounds: map[content.Ref]*fl.RoundResult{}, records: map[content.Ref]*signed{}, specs: map[content.Ref]*fl.Canonical{}}
}

// Run reads a run's whole account: its completed steps, every record its
// finished round jobs hold, and the charges composed per silo and dataset.
func (r *Reader) Run(ctx context.Context, st coordinator.RunStatus) (*Run, error) {
	jobs := map[content.Ref]jobRecords{}
	var all []Record
	for _, id := range st.Jobs {
		jr, err := r.jobRecords(ctx, st.ID, id)
		if err != nil {
			return nil, err
		}
		jobs[id] = jr
		all = append(all, jr.recs...)
	}
	steps, err := r.steps(ctx, st, 0, func(_ context.Context, id content.Ref) (jobRecords, error) { return jobs[id], nil })
	if err != nil {
		return nil, err
	}
	ds, err := Datasets(all)
	if err != nil {
		return nil, err
	}
	return &Run{Status: st, Steps: steps, Records: all, Datasets: ds}, nil
}

// Steps reads the run's completed steps from index from on, reading only
// the round jobs that attempted them: what a watch needs as steps land.
func (r *Reader) Steps(ctx context.Context, st coordinator.RunStatus, from int) ([]Step, error) {
	return r.steps(ctx, st, from, func(ctx context.Context, id content.Ref) (jobRecords, error) {
		return r.jobRecords(ctx, st.ID, id)
	})
}

// steps builds steps from..len(st.Models) with the records read by
// recordsOf. A step's attempts are the run's jobs after the job that
// produced the step before it, up to the job its round result names.
func (r *Reader) steps(ctx context.Context, st coordinator.RunStatus, from int, recordsOf func(context.Context, content.Ref) (jobRecords, error)) ([]Step, error) {
	start := 0 // index in st.Jobs of the first attempt of step from
	if from > 0 && from <= len(st.Models) {
		prev, err := r.round(ctx, st.Models[from-1])
		if err != nil {
			return nil, err
		}
		start = slices.Index(st.Jobs, prev.Job) + 1
	}
	var out []Step
	for i := from; i < len(st.Models); i++ {
		rr, err := r.round(ctx, st.Models[i])
		if err != nil {
			return out, err
		}
		end := slices.Index(st.Jobs, rr.Job)
		attempts := []content.Ref{rr.Job}
		if end >= start {
			attempts = slices.Clone(st.Jobs[start : end+1])
			start = end + 1
		}
		step := Step{Result: rr, Attempts: attempts}
		var recs []Record
		for _, id := range attempts {
			jr, err := recordsOf(ctx, id)
			if err != nil {
				return out, err
			}
			recs = append(recs, jr.recs...)
			if id == rr.Job {
				step.SubmittedAt, step.DoneAt = jr.js.SubmittedAt, jr.js.DoneAt
			}
		}
		step.Summary = summarise(rr, recs)
		out = append(out, step)
	}
	return out, nil
}

// summarise is a step's row: its metrics, and per silo the ε of every
// distinct charge for the step's round (any attempt's record names it)
// and, for a silo whose update the step's sum does not hold, how it ended
// its last attempt of the step when not by contributing (a silo that
// declined the first attempt is left out of the retry: its refusal says
// why). A silo that contributed without a charge (no DP) is listed with
// ε 0.
func summarise(rr *fl.RoundResult, recs []Record) fl.RoundSummary {
	row := fl.NewRoundSummary(rr.Round, rr.Step, rr.Participants, rr.Dropped, rr.Metrics, rr.Model)
	row.Staleness, row.Absent = rr.Staleness, rr.Absent
	counted := map[content.Ref]bool{}
	last := map[string]Record{} // silo → its record of the latest attempt it reported to
	for _, rec := range recs {
		if rec.Round != rr.Round {
			continue
		}
		if rec.LedgerEntry != "" && !counted[rec.LedgerEntry] {
			counted[rec.LedgerEntry] = true
			row.Epsilon[rec.Silo] += rec.Epsilon
		}
		last[rec.Silo] = rec
	}
	for s, rec := range last {
		switch {
		case slices.Contains(rr.Participants, s):
			if _, ok := row.Epsilon[s]; !ok {
				row.Epsilon[s] = 0
			}
		case rec.Status != silo.Contributed:
			reason := rec.Status
			if len(rec.Refusals) > 0 {
				reason = fmt.Sprintf("%s %s", rec.Refusals[0].Code, rec.Refusals[0].Message)
			}
			row.Declined[s] = reason
		}
	}
	return row
}

// jobRecords is a round job's status and the records reported to it.
type jobRecords struct {
	js   coordinator.JobStatus
	recs []Record
}

// jobRecords reads a round job and its records: each decided shard's
// result (its receipt cites it), and once the job is over (reduced or
// abandoned) every other report (an abandoned attempt's, or a late one).
// Until then an undecided shard's reports are not read (law 13). A
// decided result that
// cannot be read is an error; a report whose blob never arrived (the silo
// died reporting) proves nothing and is skipped, as is a blob that is no
// record of this run.
func (r *Reader) jobRecords(ctx context.Context, run, id content.Ref) (jobRecords, error) {
	js, err := r.src.Job(ctx, id)
	if err != nil {
		return jobRecords{}, err
	}
	out := jobRecords{js: js}
	over := js.State == coordinator.JobDone || js.State == coordinator.JobAbandoned
	for _, s := range js.Shards {
		seen := map[content.Ref]bool{}
		if s.State == coordinator.StateVerified && s.Result != "" {
			seen[s.Result] = true
			rec, err := r.record(ctx, s.Result)
			if err != nil {
				return out, fmt.Errorf("the record job %s shard %d decided: %w", id.Short(), s.Index, err)
			}
			if rec != nil && rec.rec.Run == run {
				out.recs = append(out.recs, Record{Contribution: rec.rec, Ref: s.Result, ReportedTo: id,
					Proof: ByReceipt, Receipt: s.Receipt, Verified: rec.verified})
			}
		}
		for _, rep := range s.Reports {
			if !over || seen[rep.Result] || rep.Result == "" {
				continue
			}
			seen[rep.Result] = true
			rec, err := r.record(ctx, rep.Result)
			if err != nil || rec == nil || rec.rec.Run != run {
				continue
			}
			proof := ByAbandoned
			if js.State == coordinator.JobDone {
				proof = ByLate
			}
			out.recs = append(out.recs, Record{Contribution: rec.rec, Ref: rep.Result, ReportedTo: id, Proof: proof, Verified: rec.verified})
		}
	}
	return out, nil
}

// round reads a round result by hash, once.
func (r *Reader) round(ctx context.Context, ref content.Ref) (*fl.RoundResult, error) {
	rr, err := kept(ctx, r, r.rounds, ref, func(b []byte) (*fl.RoundResult, error) {
		rr, _, err := fl.DecodeRoundResult(b)
		return rr, err
	})
	if err != nil {
		return nil, fmt.Errorf("the round result %s: %w", ref.Short(), err)
	}
	return rr, nil
}

// record reads a contribution record by hash and checks its signature,
// once; nil (and no error) when the blob is not a contribution record.
func (r *Reader) record(ctx context.Context, ref content.Ref) (*signed, error) {
	return kept(ctx, r, r.records, ref, func(b []byte) (*signed, error) {
		sc, err := silo.DecodeContribution(b)
		if err != nil {
			return nil, nil // kept as nil: the hash fixes that it is none
		}
		return &signed{rec: sc.Record, verified: r.fed != nil && sc.Verify(r.fed) == nil}, nil
	})
}

// kept returns what m keeps for ref, or fetches the blob ref names,
// checks its hash, decodes it and keeps the value: a blob's hash fixes
// what it decodes to. A fetch or decode that fails is not kept, and is
// tried again on the next read.
func kept[T any](ctx context.Context, r *Reader, m map[content.Ref]T, ref content.Ref, decode func([]byte) (T, error)) (T, error) {
	r.mu.Lock()
	v, ok := m[ref]
	r.mu.Unlock()
	if ok {
		return v, nil
	}
	var zero T
	b, err := r.src.Blob(ctx, ref)
	if err != nil {
		return zero, err
	}
	if content.Hash(b) != ref {
		return zero, fmt.Errorf("the blob does not hash to %s", ref.Short())
	}
	if v, err = decode(b); err != nil {
		return zero, err
	}
	r.mu.Lock()
	m[ref] = v
	r.mu.Unlock()
	return v, nil
}

// Label is the label column the run's contributing silos' records name,
// when every one that names one names the same; "" otherwise.
func (a *Run) Label() string {
	label := ""
	for _, rec := range a.Records {
		if rec.Status != silo.Contributed || rec.Label == "" {
			continue
		}
		if label != "" && rec.Label != label {
			return ""
		}
		label = rec.Label
	}
	return label
}
