package coordinator

import "github.com/scellis/scellis/content"

// Event is something that happened while applying a command, for a server
// to stream as a server-sent event: Kind is the SSE event name and the
// value itself (a plain struct with JSON tags) is the data. Events are
// returned by Apply in the order they happened; they are not stored, so a
// replica replaying its log produces the same events again.
type Event interface {
	Kind() string
	JobID() content.Ref
}

// JobSubmitted: a job was admitted.
type JobSubmitted struct {
	Job    content.Ref `json:"job"`
	Name   string      `json:"name"`
	Shards int         `json:"shards"`
	Policy Policy      `json:"policy"`
}

// ShardLeased: a lease was granted.
type ShardLeased struct {
	Job    content.Ref `json:"job"`
	Shard  int         `json:"shard"`
	Peer   string      `json:"peer"`
	Expiry int64       `json:"expiry"`
}

// LeaseEnd says why a lease ended without a report.
type LeaseEnd string

const (
	LeaseExpired  LeaseEnd = "expired"  // its expiry passed
	LeaseReleased LeaseEnd = "released" // the peer handed it back
	LeaseRevoked  LeaseEnd = "revoked"  // the shard was decided meanwhile
)

// LeaseEnded: a lease ended without a report; the shard may be leased again.
type LeaseEnded struct {
	Job    content.Ref `json:"job"`
	Shard  int         `json:"shard"`
	Peer   string      `json:"peer"`
	Reason LeaseEnd    `json:"reason"`
}

// ResultReported: a result hash was accepted.
type ResultReported struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Peer    string      `json:"peer"`
	Result  content.Ref `json:"result"`
	Late    bool        `json:"late"`
	Outcome Outcome     `json:"outcome"`
}

// ShardVerified: a shard reached agreement and a receipt was minted.
type ShardVerified struct {
	Job      content.Ref `json:"job"`
	Shard    int         `json:"shard"`
	Result   content.Ref `json:"result"`
	Agreeing []string    `json:"agreeing"`
	Losers   []string    `json:"losers,omitempty"`
	Receipt  uint64      `json:"receipt"`
}

// ShardFlagged: a shard cannot be verified within its attempts; it is
// marked unverified and never counted.
type ShardFlagged struct {
	Job     content.Ref `json:"job"`
	Shard   int         `json:"shard"`
	Reports int         `json:"reports"`
	Reason  string      `json:"reason"`
}

// AllShardsDecided: every shard of the job is verified or flagged; the
// job waits for its reducer.
type AllShardsDecided struct {
	Job        content.Ref `json:"job"`
	Verified   int         `json:"verified"`
	Unverified int         `json:"unverified"`
}

// JobComplete: a reducer peer reported the reduced result's hash.
type JobComplete struct {
	Job     content.Ref `json:"job"`
	Reduced content.Ref `json:"reduced"`
	Reducer string      `json:"reducer"`
}

func (JobSubmitted) Kind() string     { return "job-submitted" }
func (ShardLeased) Kind() string      { return "shard-leased" }
func (LeaseEnded) Kind() string       { return "lease-ended" }
func (ResultReported) Kind() string   { return "result-reported" }
func (ShardVerified) Kind() string    { return "shard-verified" }
func (ShardFlagged) Kind() string     { return "shard-flagged" }
func (AllShardsDecided) Kind() string { return "job-decided" }
func (JobComplete) Kind() string      { return "job-complete" }

func (e JobSubmitted) JobID() content.Ref     { return e.Job }
func (e ShardLeased) JobID() content.Ref      { return e.Job }
func (e LeaseEnded) JobID() content.Ref       { return e.Job }
func (e ResultReported) JobID() content.Ref   { return e.Job }
func (e ShardVerified) JobID() content.Ref    { return e.Job }
func (e ShardFlagged) JobID() content.Ref     { return e.Job }
func (e AllShardsDecided) JobID() content.Ref { return e.Job }
func (e JobComplete) JobID() content.Ref      { return e.Job }
