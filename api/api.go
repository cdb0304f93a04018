// Package api is the control plane's HTTP/JSON interface: submit and watch
// jobs, lease shards, renew and release leases, report result hashes, read
// receipts. It runs behind mutual TLS pinned to the federation file, so every
// request has an authenticated member. It carries hashes, never result bytes
// (law 3): request bodies are small and bounded, and results travel through
// the separate blob endpoint. Writes go to the Raft leader; a follower
// answers 307 with the leader's address and clients follow it.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// Applied is the outcome of one coordinator command: its JSON response, or
// the diagnostics that refused it.
type Applied struct {
	Response json.RawMessage `json:"response,omitempty"`
	Refusal  diag.List       `json:"refusal,omitempty"`
}

// Applier proposes coordinator commands (through Raft on an aggregator).
// Apply returns a *NotLeaderError when this node cannot commit writes.
type Applier interface {
	Apply(ctx context.Context, cmd coordinator.Command) (Applied, error)
}

// Reader answers queries from the local replica of the coordinator state.
// Followers may lag the leader by a few entries.
type Reader interface {
	Job(id content.Ref) (coordinator.JobStatus, error)
	Jobs() []coordinator.JobStatus
	Receipts(since uint64) []receipt.Receipt
	Contributions() map[string]int64
	Peers() []coordinator.PeerRecord
	// Runs and Run read the training runs.
	Runs() []coordinator.RunStatus
	Run(id content.Ref) (coordinator.RunStatus, error)
	// Leasable is how many shards a lease by peer of kinds (empty: every
	// kind) at now would get; an idle worker's poll is answered from it
	// without a log entry.
	Leasable(peer string, kinds coordinator.Kinds, now int64) int
	// RevealOpen says whether a reveal on job's shard at now would pass
	// the reveal window, and when it opens at the latest; an early reveal
	// is answered from it without a log entry.
	RevealOpen(job content.Ref, shard int, now int64) (bool, int64)
	// ResultUse says whether ref is a reported result, and of which
	// shards: the blob endpoint serves undecided results to aggregators
	// only (law 13).
	ResultUse(ref content.Ref) coordinator.ResultUse
}

// Planner turns a submitted bundle into the SubmitJob command: it compiles
// the bundle itself (prices come from the planner, never from the
// submitter) and runs admission.
type Planner interface {
	Plan(ctx context.Context, bundle content.Ref, submitter string) (coordinator.SubmitJob, error)
}

// RunPlanner turns a launched run into the StartRun command: it reads the
// run's canonical spec from the blob store, resolves the strategy (built
// in, or the uploaded source), picks the cohort and fills in the
// protections admission checks. The server stamps Now.
type RunPlanner interface {
	PlanRun(ctx context.Context, req RunRequest, submitter string) (coordinator.StartRun, error)
}

// NotLeaderError says which node to send writes to.
type NotLeaderError struct {
	Leader string // member name, "" when unknown (an election is running)
	URL    string // the leader's API base URL
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "not the leader, and no leader is known yet"
	}
	return fmt.Sprintf("not the leader; the leader is %s (%s)", e.Leader, e.URL)
}

// ErrNoLeader is returned by clients when no node can accept writes.
var ErrNoLeader = errors.New("api: no leader reachable")

// Request and response bodies.

// SubmitRequest submits a job bundle already uploaded to the blob store.
type SubmitRequest struct {
	Bundle content.Ref `json:"bundle"`
}

// RunRequest launches a training run. Spec is the ref of the run's
// canonical spec (fl.Canonical, content.Encode), already uploaded with
// PutBlob; it is also the run's ID. Strategy, optional, is the ref of the
// strategy's source when it is not built in: it must be the spec's
// strategy ref, and the source must be uploaded too.
type RunRequest struct {
	Spec     content.Ref `json:"spec"`
	Strategy content.Ref `json:"strategy,omitempty"`
}

// LeaseRequest asks for up to Max shards.
type LeaseRequest struct {
	Max       int         `json:"max"`
	Job       content.Ref `json:"job,omitempty"`
	RequestID string      `json:"request_id,omitempty"`
	// WaitMS makes the request a long poll: with nothing to lease, the
	// leader holds it up to WaitMS (at most 30 s) and answers as soon as a
	// shard becomes leasable for the peer. It is also the peer's
	// heartbeat: a silo that stops polling is left out of rounds.
	WaitMS int `json:"wait_ms,omitempty"`
	// Heartbeat makes the request lease nothing: the leader holds it
	// WaitMS (at most 30 s, and within its silo lease) and answers with
	// no grants. Every node of a child cluster holds one toward its
	// parent (docs/tree.md): the child is alive there while one is held,
	// and gone at once when the last one's connection closes.
	Heartbeat bool `json:"heartbeat,omitempty"`
	// Kinds limits the request to shards of these kinds ("round",
	// "generic"); empty: every kind. A silo leases its training rounds
	// with requests of their own, and generic shards only when its policy
	// takes them, so it is never granted a shard it would hand back, and
	// a round never waits behind generic work (docs/silo.md). A node
	// older than this field refuses a request that sets it (unknown
	// field): upgrade the aggregators before the silos.
	Kinds coordinator.Kinds `json:"kinds,omitempty"`
}

// RenewRequest renews one lease.
type RenewRequest struct {
	Job   content.Ref `json:"job"`
	Shard int         `json:"shard"`
}

// ReleaseRequest hands back leases (all when Shards is empty).
type ReleaseRequest struct {
	Shards []coordinator.ShardRef `json:"shards,omitempty"`
}

// CommitRequest commits the caller to a result for one shard:
// Commitment is coordinator.Commitment(result, caller, job, shard, nonce).
type CommitRequest struct {
	Job        content.Ref `json:"job"`
	Shard      int         `json:"shard"`
	Commitment content.Ref `json:"commitment"`
}

// ResultReport reveals a result's hash (the bytes went to the blob store)
// and the nonce that opens the caller's commitment.
type ResultReport struct {
	Job    content.Ref `json:"job"`
	Shard  int         `json:"shard"`
	Result content.Ref `json:"result"`
	Nonce  string      `json:"nonce,omitempty"`
	// Sig is the peer's signature of its result: coordinator.StatementOf
	// signed with its identity key for purpose scellis/result/v1. The
	// coordinator refuses an unsigned report (SC7305) and puts the
	// agreeing peers' signatures in the receipt.
	Sig []byte `json:"sig,omitempty"`
	// Path, when set, says Sig signs the Merkle root of a batch of the
	// peer's statements (purpose scellis/result-batch/v1), and is this
	// statement's path to that root (receipt/batch.go): a worker signs the
	// reports of one request once. The receipt keeps Sig and Path.
	Path []byte `json:"path,omitempty"`
	// Cite, from a child cluster (role cluster, docs/tree.md), is its
	// receipt chain head, signed with its key; the receipt keeps it.
	Cite *receipt.Citation `json:"cite,omitempty"`
}

// ReducedReport reports a job's reduced result document.
type ReducedReport struct {
	Job     content.Ref `json:"job"`
	Reduced content.Ref `json:"reduced"`
	// Within: a second reducer of a convergent job found its reduction
	// within the job's tolerance of the recorded one.
	Within bool `json:"within,omitempty"`
}

// MaxRequestBytes bounds every control-plane request body: hashes and
// names fit easily; tensors and result bytes do not, by design.
const MaxRequestBytes = 16 << 10
