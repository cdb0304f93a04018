package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Result is what applying one command gives: a response (its type depends
// on the command, see Apply), the events that happened, or a refusal.
// A refused command changed nothing; Response is then nil.
type Result struct {
	Response any       `json:"response,omitempty"`
	Events   []Event   `json:"-"` // published to the event hub, not sent back
	Refusal  diag.List `json:"refusal,omitempty"`
}

// Refused reports whether the command was refused.
func (r Result) Refused() bool { return len(r.Refusal) > 0 }

// Err returns the refusal as an error (a diag.List), or nil.
func (r Result) Err() error {
	if len(r.Refusal) == 0 {
		return nil
	}
	return r.Refusal
}

func refuse(d ...*diag.Diagnostic) Result { return Result{Refusal: diag.List(d)} }

// SubmitResponse answers SubmitJob.
type SubmitResponse struct {
	Job    content.Ref `json:"job"`
	Shards int         `json:"shards"`
	// Policy is the job's policy with the pool's defaults filled in.
	Policy Policy `json:"policy"`
	// Method is the verification method receipts will name.
	Method string `json:"method"`
	// Existing is true when the job had been submitted before (a retry).
	Existing bool `json:"existing"`
}

// LeaseGrant is one live lease.
type LeaseGrant struct {
	Job     content.Ref `cbor:"job" json:"job"`
	Shard   int         `cbor:"shard" json:"shard"`
	ShardID content.Ref `cbor:"shard_id" json:"shard_id"`
	Price   int64       `cbor:"price" json:"price"`
	Expiry  int64       `cbor:"expiry" json:"expiry"`
}

// LeaseResponse answers Lease. Grants is empty when there is no work for
// the peer now.
type LeaseResponse struct {
	Grants []LeaseGrant `json:"grants"`
	// Jobs describes each job the grants name, once: what a worker
	// needs to compile the job and deliver its results, so it need not
	// read the job's status (with every shard) before its first shard.
	Jobs []LeaseJob `json:"jobs,omitempty"`
}

// LeaseJob is what a lease tells its peer about a granted shard's job:
// the same fields as the job's status.
type LeaseJob struct {
	Job    content.Ref `json:"job"`
	Bundle content.Ref `json:"bundle"`
	Policy Policy      `json:"policy"`
	// Run and Round name the training run a round job belongs to (empty
	// for other jobs): a silo takes its round from here without reading
	// the job's status first (issue 19).
	Run   content.Ref `json:"run,omitempty"`
	Round int         `json:"round,omitempty"`
	// Delegated is set for a sub-job: it runs its parent job's plan
	// (docs/tree.md).
	Delegated *Delegation `json:"delegated,omitempty"`
}

// RenewResponse answers RenewLease with the lease's new expiry.
type RenewResponse struct {
	Grant LeaseGrant `json:"grant"`
}

// ReleaseResponse answers ReleaseLeases with the leases it ended.
type ReleaseResponse struct {
	Released []ShardRef `json:"released"`
}

// ExpiredLease is a lease that a clock advance ended.
type ExpiredLease struct {
	Job   content.Ref `json:"job"`
	Shard int         `json:"shard"`
	Peer  string      `json:"peer"`
}

// TickResponse answers Tick.
type TickResponse struct {
	Now     int64          `json:"now"`
	Expired []ExpiredLease `json:"expired"`
}

// Outcome is what a result report did.
type Outcome string

const (
	// OutcomeCounted: counted toward the shard's decision, still pending.
	OutcomeCounted Outcome = "counted"
	// OutcomeVerified: this report completed the agreement.
	OutcomeVerified Outcome = "verified"
	// OutcomeFlagged: after this report the shard can no longer be
	// verified within its attempts; it is flagged unverified.
	OutcomeFlagged Outcome = "flagged"
	// OutcomeExtraAgrees: the shard was already verified; the report
	// agrees with it (recorded, not credited).
	OutcomeExtraAgrees Outcome = "extra-agrees"
	// OutcomeExtraDisagrees: the shard was already verified; the report
	// differs and is recorded as lost.
	OutcomeExtraDisagrees Outcome = "extra-disagrees"
	// OutcomeExtraUnverified: the shard was already flagged; recorded only.
	OutcomeExtraUnverified Outcome = "extra-unverified"
)

// ReportResponse answers ReportResult. A repeated report gets the same
// response as the first.
type ReportResponse struct {
	Job    content.Ref `json:"job"`
	Shard  int         `json:"shard"`
	Peer   string      `json:"peer"`
	Result content.Ref `json:"result"`
	// Late is true when the peer's lease had already ended.
	Late    bool    `json:"late"`
	Outcome Outcome `json:"outcome"`
}

// ReducedResponse answers ReportReduced.
type ReducedResponse struct {
	Job     content.Ref `json:"job"`
	Reduced content.Ref `json:"reduced"`
	Reducer string      `json:"reducer"` // the first reducer to report it
	// Existing is true when the same hash had been reported before.
	Existing bool `json:"existing"`
	// Check is a second reducer's verdict on the recorded reduction:
	// "confirmed" or "disputed" (reduction.go).
	Check string `json:"check,omitempty"`
}

// BatchResponse answers Batch: one Result per command, in order.
type BatchResponse struct {
	Results []Result `json:"results"`
}
