package coordinator

import (
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Command is one input to the state machine: SubmitJob, Lease, RenewLease,
// ReleaseLeases, Tick, ReportResult, ReportReduced or Batch (values or
// pointers). Every command is a plain struct that EncodeCommand turns into
// canonical bytes, so it can be a Raft log entry.
//
// Time enters only through the Now fields (unix ms, stamped by the leader
// when it proposes the command), never from a clock read inside Apply.
type Command interface {
	command()
}

// Policy is a job's verification policy. Zero fields take the pool's
// defaults when the job is submitted (see SubmitJob).
type Policy struct {
	// Replicas is how many distinct peers must report the byte-identical
	// result hash. Default: 1 in an own pool, 2 in consortium and open.
	Replicas int `cbor:"replicas" json:"replicas"`
	// Attempts bounds the reports a shard may take before it is flagged
	// unverified. Default: 2·Replicas+1. Must be ≥ Replicas.
	Attempts int `cbor:"attempts" json:"attempts"`
	// LeaseTTL is the default lease duration in ms. Default: the machine's
	// Config.DefaultLeaseTTL.
	LeaseTTL int64 `cbor:"lease_ttl" json:"lease_ttl"`
	// Mode is ModeQuorum ("" too: every shard needs Replicas agreeing
	// peers) or ModeAdaptive (spot checks by reputation: an audited shard
	// needs Replicas agreeing peers, any other one peer; see spotcheck.go).
	Mode string `cbor:"mode,omitempty" json:"mode,omitempty"`
	// Check is how results are judged when not by equal hashes: "compare"
	// (the convergent tier: a verifier peer compares the replicas within
	// Tolerance with the content's compare function) or "freivalds" (a
	// verifier peer checks one execution with Rounds Freivalds rounds).
	// Empty: the replayable tier's exact match. The coordinator never
	// sees the results; it records the verifier's verdict (verdict.go).
	Check string `cbor:"check,omitempty" json:"check,omitempty"`
	// Tolerance describes the convergent tier's tolerance, for the method
	// receipts record ("abs=…,rel=…,per=…").
	Tolerance string `cbor:"tolerance,omitempty" json:"tolerance,omitempty"`
	// Rounds is the k of a Freivalds check (error probability 2^-k).
	Rounds int `cbor:"rounds,omitempty" json:"rounds,omitempty"`
	// TrustAfter and AuditOneIn are an adaptive job's spot-check knobs
	// (spotcheck.go): a peer runs the job's shards alone once its streak
	// of valid checks reaches TrustAfter, and is then audited with
	// probability 1/AuditOneIn. 0: SpotParams' (filled in on submission).
	// Exclusion and the re-check window stay pool-wide (SpotParams): they
	// act on a peer's record across jobs.
	TrustAfter int `cbor:"trust_after,omitempty" json:"trust_after,omitempty"`
	AuditOneIn int `cbor:"audit_one_in,omitempty" json:"audit_one_in,omitempty"`
}

// ShardPlan is one shard as the planner made it: priced before execution.
type ShardPlan struct {
	Index int         `cbor:"index" json:"index"`
	ID    content.Ref `cbor:"id" json:"id"`
	// Price is the planner's price in work units; nothing a peer reports
	// changes it.
	Price int64 `cbor:"price" json:"price"`
	// PriceBasis says how Price was derived, e.g. "program cost()".
	PriceBasis string `cbor:"price_basis" json:"price_basis"`
	// Peer, when set, is the only peer that may lease the shard: work that
	// needs data only that peer holds (a silo's training step).
	Peer string `cbor:"peer,omitempty" json:"peer,omitempty"`
	// Via, with Peer, names the child cluster that leads the silo Peer in
	// a tree of clusters: the child's delegate may lease the shard for it
	// (a hierarchical round's sub-cohort, docs/tree.md).
	Via string `cbor:"via,omitempty" json:"via,omitempty"`
}

// ShardRef names one shard of one job.
type ShardRef struct {
	Job   content.Ref `cbor:"job" json:"job"`
	Shard int         `cbor:"shard" json:"shard"`
}

// SubmitJob admits a planned job. The planner (outside the machine) has
// computed the job ID, the shards, their IDs and prices. The machine
// re-checks the job against the pool's regime with trust.Admit. Submitting
// the same job ID again with the same plan is a no-op returning the existing
// job; with a different plan it is refused (SC7004).
type SubmitJob struct {
	Job    content.Ref `cbor:"job" json:"job"`
	Name   string      `cbor:"name" json:"name"`
	Bundle content.Ref `cbor:"bundle" json:"bundle"` // the job bundle blob peers compile the plan from
	// Run and Round make the job a round of a training run (StartRun).
	Run              content.Ref  `cbor:"run,omitempty" json:"run,omitempty"`
	Round            int          `cbor:"round,omitempty" json:"round,omitempty"`
	Regime           trust.Regime `cbor:"regime" json:"regime"` // empty: the pool's
	SecurityCritical bool         `cbor:"security_critical" json:"security_critical"`
	Inputs           []trust.Item `cbor:"inputs" json:"inputs"` // inputs and their classes
	Models           []trust.Item `cbor:"models" json:"models"` // classed content (models)
	Policy           Policy       `cbor:"policy" json:"policy"`
	Shards           []ShardPlan  `cbor:"shards" json:"shards"`
	// Submitter is the member who submitted the job (stamped by the
	// server from the caller's certificate): it may cancel the job. It is
	// not part of the plan, so a second submission of the same job by
	// someone else is the same job, still owned by its first submitter.
	Submitter string `cbor:"submitter,omitempty" json:"submitter,omitempty"`
	// Canaries are the known answers the planner computed for some shards
	// of an adaptive job. They are not part of the plan (a resubmission
	// with other canaries is the same job) and never shown to peers.
	Canaries []Canary `cbor:"canaries,omitempty" json:"canaries,omitempty"`
	// Delegated, when set, makes the job a sub-job: a child cluster's
	// share of a parent cluster's job (delegate.go). Its ID is then
	// SubJobID(*Delegated).
	Delegated *Delegation `cbor:"delegated,omitempty" json:"delegated,omitempty"`
	// Seed is random bytes the submitting node draws (crypto/rand), in
	// hex (at most MaxSeed characters; law 3 keeps byte slices out of
	// commands): the order in which a browser volunteer is offered
	// the job's shards is derived from it (volunteerOrder), so no
	// volunteer can predict which shards it or another key will get. It
	// is not part of the plan and never shown to peers. Empty: index
	// order.
	Seed string `cbor:"seed,omitempty" json:"seed,omitempty"`
	Now  int64  `cbor:"now" json:"now"`
}

// MaxSeed bounds SubmitJob.Seed.
const MaxSeed = 64

// Lease asks for up to Max shards (default 1) for Peer, of Kinds (empty:
// every kind). Grants go to shards that still need replicas: training
// rounds' first, then jobs in submission order, shards in index order;
// never a shard the peer already holds a live lease on or has reported
// for. With a RequestID, repeating the peer's last request of the same
// kinds returns the same grants instead of granting more.
type Lease struct {
	Peer      string      `cbor:"peer" json:"peer"`
	Now       int64       `cbor:"now" json:"now"`
	TTL       int64       `cbor:"ttl" json:"ttl"`               // ms; 0: the job's LeaseTTL
	Max       int         `cbor:"max" json:"max"`               // 0: 1
	Job       content.Ref `cbor:"job" json:"job"`               // optional: only this job
	RequestID string      `cbor:"request_id" json:"request_id"` // optional: idempotent retry
	// Hold caps the live leases a browser volunteer (receipt.IsVolunteer)
	// may hold at once, this lease's grants included: 0 means
	// DefaultVolunteerLeases, at most MaxVolunteerLeases. The volunteer
	// server sets it from the node's config (volunteer_max_leases); it is
	// in the command, not the node's config, so every replica decides
	// alike. Ignored for members.
	Hold int `cbor:"hold,omitempty" json:"hold,omitempty"`
	// Kinds limits the grants to shards of these kinds (kinds.go): a
	// silo asks for its rounds apart from generic work, and for generic
	// work only when its policy takes it.
	Kinds Kinds `cbor:"kinds,omitempty" json:"kinds,omitempty"`
	// Origin is the network the lease is asked from, as the volunteer
	// server saw it when the tab joined (volunteer.Prefix: the /24 of an
	// IPv4 address, the /56 of an IPv6 one). A shard is never leased to a
	// peer whose origin equals that of another peer holding a live lease
	// on it or having committed or reported for it, so two keys held by
	// one person on one network cannot answer one shard together. Empty
	// (members): no rule.
	Origin string `cbor:"origin,omitempty" json:"origin,omitempty"`
}

// RenewLease extends Peer's live lease on one shard to Now+TTL (never
// shortening it). Refused (SC7009) when the lease is no longer live: the
// worker should stop working on the shard.
type RenewLease struct {
	Peer  string      `cbor:"peer" json:"peer"`
	Job   content.Ref `cbor:"job" json:"job"`
	Shard int         `cbor:"shard" json:"shard"`
	Now   int64       `cbor:"now" json:"now"`
	TTL   int64       `cbor:"ttl" json:"ttl"` // ms; 0: the job's LeaseTTL
}

// ReleaseLeases hands back Peer's live leases on Shards, or all of them
// when Shards is empty (a worker stopping on SIGINT). Releasing a lease the
// peer does not hold is a no-op.
type ReleaseLeases struct {
	Peer   string     `cbor:"peer" json:"peer"`
	Now    int64      `cbor:"now" json:"now"`
	Shards []ShardRef `cbor:"shards" json:"shards"`
}

// Tick advances the machine's clock to Now and expires every lease whose
// expiry is ≤ Now, so its shard can be leased again. Every other command
// with a Now does the same first.
type Tick struct {
	Now int64 `cbor:"now" json:"now"`
}

// ReportResult reports the hash of Peer's result for one shard. Accepted
// with a live lease; after the lease ended (expired, released or revoked)
// only as an extra replica, which counts while the shard is undecided and
// never changes a decision. A peer that never held a lease on the shard is
// refused (SC7007). Repeating a report is a no-op returning the same
// response; reporting a different hash is refused (SC7008).
type ReportResult struct {
	Peer   string      `cbor:"peer" json:"peer"`
	Job    content.Ref `cbor:"job" json:"job"`
	Shard  int         `cbor:"shard" json:"shard"`
	Result content.Ref `cbor:"result" json:"result"`
	// Nonce opens the peer's commitment (CommitResult), in hex.
	Nonce string `cbor:"nonce,omitempty" json:"nonce,omitempty"`
	// Key is the peer's public key as the proposing server authenticated
	// it (identity's text form), and Sig the peer's signature of its
	// receipt.Statement (job, shard, result, the job's tier) with it. In
	// a machine configured with SignedReports both are required and
	// checked on apply (signed.go); the agreeing peers' signatures go
	// into the receipt.
	Key string `cbor:"key,omitempty" json:"key,omitempty"`
	Sig []byte `cbor:"sig,omitempty" json:"sig,omitempty"`
	// Path, when set, says Sig signs the Merkle root of a batch of the
	// peer's statements, and is this statement's path to it
	// (receipt/batch.go); the receipt keeps it with Sig.
	Path []byte `cbor:"path,omitempty" json:"path,omitempty"`
	// Cite, from a child cluster (delegate.go), is its chain head when it
	// reports, signed with Key; the receipt keeps it.
	Cite *receipt.Citation `cbor:"cite,omitempty" json:"cite,omitempty"`
	Now  int64             `cbor:"now" json:"now"`
}

// ReportReduced records the hash of a job's reduced result, reported by a
// reducer peer once every shard is decided. Repeating it with the same hash
// is a no-op; a different hash is refused (SC7011).
type ReportReduced struct {
	Job     content.Ref `cbor:"job" json:"job"`
	Peer    string      `cbor:"peer" json:"peer"`
	Reduced content.Ref `cbor:"reduced" json:"reduced"`
	// Within, from a second reducer of a convergent job, says its own
	// reduction compared within the job's tolerance with the recorded
	// one (reduction.go). Ignored for other jobs: equal hashes decide.
	Within bool  `cbor:"within,omitempty" json:"within,omitempty"`
	Now    int64 `cbor:"now" json:"now"`
}

// ReportVerdict records a verifier peer's verdict on one shard of a job
// whose policy has a Check: which of the shard's first Judged reports
// agree (within the tolerance, or passing the Freivalds check) and the
// canonical result among them. The verifier ran the content's compare or
// verify function on the result bytes; the coordinator sees only hashes
// and peer names. Sig is the verifier's Ed25519ctx signature (purpose
// scellis/verdict/v1) of the verdict's canonical encoding without Now and
// Sig, made with Key, the verifier's identity key; a machine configured
// with SignedReports checks it on apply (signed.go) and keeps it.
type ReportVerdict struct {
	Job       content.Ref `cbor:"job" json:"job"`
	Shard     int         `cbor:"shard" json:"shard"`
	Verifier  string      `cbor:"verifier" json:"verifier"`
	Key       string      `cbor:"key,omitempty" json:"key,omitempty"`
	Judged    int         `cbor:"judged" json:"judged"`
	Agreeing  []string    `cbor:"agreeing,omitempty" json:"agreeing,omitempty"`
	Canonical content.Ref `cbor:"canonical,omitempty" json:"canonical,omitempty"`
	// Detail says what the check found (largest difference, failing
	// place), at most maxDetail bytes.
	Detail string `cbor:"detail,omitempty" json:"detail,omitempty"`
	Sig    []byte `cbor:"sig,omitempty" json:"sig,omitempty"`
	Now    int64  `cbor:"now" json:"now"`
}

// Batch applies several commands in order as one log entry. Each is
// decided on its own: a refused command leaves the state as it was and the
// rest still apply. Batches do not nest.
type Batch struct {
	Commands []Command `json:"commands"`
}

func (SubmitJob) command()     {}
func (Lease) command()         {}
func (RenewLease) command()    {}
func (ReleaseLeases) command() {}
func (Tick) command()          {}
func (ReportResult) command()  {}
func (ReportReduced) command() {}
func (ReportVerdict) command() {}
func (Batch) command()         {}
