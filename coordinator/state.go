package coordinator

import (
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify/spot"
)

// snapshotFormat versions the snapshot encoding. Bump it only with a
// migration in Restore.
const snapshotFormat = "scellis/coordinator/v1"

// state is the whole replicated state. Its exported fields are exactly what
// Snapshot encodes and StateHash hashes; unexported fields are indexes
// rebuilt from them (see rebuild). Slices and maps are omitted when empty so
// that an empty and a nil one encode alike.
type state struct {
	Format          string                 `cbor:"format"`
	Regime          trust.Regime           `cbor:"regime"`
	DefaultLeaseTTL int64                  `cbor:"default_lease_ttl"`
	Now             int64                  `cbor:"now"`
	Jobs            []*jobState            `cbor:"jobs,omitempty"`
	Peers           map[string]*PeerRecord `cbor:"peers,omitempty"`
	Receipts        []receipt.Receipt      `cbor:"receipts,omitempty"`
	// LeaseMemo is each peer's last Lease request with a RequestID and
	// the grants it received, so that a retried request is answered again;
	// one per peer and set of kinds (memoKey).
	LeaseMemo map[string]*leaseMemo `cbor:"lease_memo,omitempty"`
	// Runs are the training runs, in start order.
	Runs []*runState `cbor:"runs,omitempty"`
	// CommitReveal requires every report to open an earlier commitment
	// (commit.go).
	CommitReveal bool `cbor:"commit_reveal,omitempty"`
	// SignedReports requires every report and verdict to be signed by its
	// peer (signed.go).
	SignedReports bool `cbor:"signed_reports,omitempty"`
	// Membership is the federation's membership once a change went
	// through the log (membership.go); nil: the federation file's.
	Membership *membershipState `cbor:"membership,omitempty"`
}

type leaseMemo struct {
	RequestID string       `cbor:"request_id"`
	Grants    []LeaseGrant `cbor:"grants,omitempty"`
}

// JobState is where a job is in its life.
type JobState string

const (
	// JobRunning: some shard is still undecided.
	JobRunning JobState = "running"
	// JobDecided: every shard is verified or flagged unverified; the job
	// waits for its reducer (the "verified-all" state).
	JobDecided JobState = "decided"
	// JobDone: a reducer peer reported the reduced result's hash.
	JobDone JobState = "done"
)

type jobState struct {
	ID               content.Ref  `cbor:"id"`
	Name             string       `cbor:"name"`
	Bundle           content.Ref  `cbor:"bundle"`
	Run              content.Ref  `cbor:"run,omitempty"` // the training run this job is a round of
	Round            int          `cbor:"round,omitempty"`
	Regime           trust.Regime `cbor:"regime"`
	SecurityCritical bool         `cbor:"security_critical"`
	// ReadsInputs: the plan names input tables (SubmitJob.Inputs), which
	// a browser volunteer has no folder to hold (volunteerMay).
	ReadsInputs bool `cbor:"reads_inputs,omitempty"`
	// Seed orders the shards a browser volunteer is offered
	// (SubmitJob.Seed, volunteerOrder).
	Seed        string        `cbor:"seed,omitempty"`
	Policy      Policy        `cbor:"policy"`
	Method      string        `cbor:"method"`
	Plan        content.Ref   `cbor:"plan"` // hash of the submission without Now
	SubmittedAt int64         `cbor:"submitted_at"`
	Submitter   string        `cbor:"submitter,omitempty"` // who may cancel it, with operators
	State       JobState      `cbor:"state"`
	Shards      []*shardState `cbor:"shards"`
	Reduced     content.Ref   `cbor:"reduced,omitempty"`
	Reducer     string        `cbor:"reducer,omitempty"`
	DoneAt      int64         `cbor:"done_at,omitempty"`
	// ReductionChecks are second reducers' reports (reduction.go).
	ReductionChecks []ReductionCheck `cbor:"reduction_checks,omitempty"`
	// Delegated: the job is a sub-job of a parent cluster's (delegate.go).
	Delegated *Delegation `cbor:"delegated,omitempty"`

	decided int // shards verified or unverified
	cursor  int // every shard below it is decided
}

// ShardState is where a shard is: pending (possibly leased), verified or
// unverified (flagged).
type ShardState string

const (
	StatePending    ShardState = "pending"
	StateLeased     ShardState = "leased" // only in queries: pending with a live lease
	StateVerified   ShardState = "verified"
	StateUnverified ShardState = "unverified"
)

type shardState struct {
	Index      int         `cbor:"index"`
	ID         content.Ref `cbor:"id"`
	Price      int64       `cbor:"price"`
	PriceBasis string      `cbor:"price_basis"`
	Peer       string      `cbor:"peer,omitempty"` // the only peer that may lease it, if set
	Via        string      `cbor:"via,omitempty"`  // the child cluster that may lease it for Peer
	State      ShardState  `cbor:"state"`
	// Leases are the live leases, sorted by peer; at most one per peer.
	Leases []lease `cbor:"leases,omitempty"`
	// Holders are the peers ever granted a lease on the shard, sorted.
	Holders []string `cbor:"holders,omitempty"`
	// Origins are the network origins (Lease.Origin: a browser
	// volunteer's join prefix) holders leased the shard from, by peer;
	// two peers of one origin never hold or answer one shard together
	// (sameOrigin).
	Origins map[string]string `cbor:"origins,omitempty"`
	// Commits are the peers' commitments in arrival order, at most one per
	// peer (commit.go).
	Commits []commitment `cbor:"commits,omitempty"`
	// Reports in arrival order, at most one per peer.
	Reports []report `cbor:"reports,omitempty"`
	// Verdicts are a checked job's verifier verdicts, in order (verdict.go).
	Verdicts  []verdictRecord `cbor:"verdicts,omitempty"`
	Canonical content.Ref     `cbor:"canonical,omitempty"`
	Agreeing  []string        `cbor:"agreeing,omitempty"`
	Losers    []string        `cbor:"losers,omitempty"`
	Receipt   uint64          `cbor:"receipt,omitempty"`
	DecidedAt int64           `cbor:"decided_at,omitempty"`

	// Adaptive mode (spotcheck.go). Canary is the planner's known answer;
	// Draws counts the commitments the leader's draws have covered; Audit
	// is "", alone or audited; Auditor is the peer the last draw reserved
	// the shard for, until AuditorUntil. While the accepted result Prior is
	// re-checked, Recheck is 1 + the index of the first fresh report.
	// Method is how the shard was accepted (empty: the job's method).
	Canary       content.Ref `cbor:"canary,omitempty"`
	Draws        int         `cbor:"draws,omitempty"`
	Audit        string      `cbor:"audit,omitempty"`
	Auditor      string      `cbor:"auditor,omitempty"`
	AuditorUntil int64       `cbor:"auditor_until,omitempty"`
	Recheck      int         `cbor:"recheck,omitempty"`
	Prior        content.Ref `cbor:"prior,omitempty"`
	Method       string      `cbor:"method,omitempty"`
}

type lease struct {
	Peer   string `cbor:"peer"`
	Expiry int64  `cbor:"expiry"`
}

type report struct {
	Peer    string      `cbor:"peer"`
	Result  content.Ref `cbor:"result"`
	Late    bool        `cbor:"late"`
	Outcome Outcome     `cbor:"outcome"`
	At      int64       `cbor:"at"`
	// Key and Sig: the peer's signature of its result (signed.go).
	Key string `cbor:"key,omitempty"`
	Sig []byte `cbor:"sig,omitempty"`
	// Path: Sig's batch path, when it signs a batch (receipt/batch.go).
	Path []byte `cbor:"path,omitempty"`
	// Cite: a child cluster's citation of its chain head (delegate.go).
	Cite *receipt.Citation `cbor:"cite,omitempty"`
}

// PeerRecord is what the pool knows of one peer's work.
type PeerRecord struct {
	Peer string `cbor:"peer" json:"peer"`
	// Leases granted to the peer.
	Leases int `cbor:"leases" json:"leases"`
	// Reports accepted from the peer, and how many of them came late.
	Reports int `cbor:"reports" json:"reports"`
	Late    int `cbor:"late" json:"late"`
	// Won: shards verified with the peer among the agreeing peers.
	Won int `cbor:"won" json:"won"`
	// Lost: reports whose hash differed from the canonical result.
	Lost int `cbor:"lost" json:"lost"`
	// Standing: results verified with the peer among the agreeing peers
	// since its last result that lost or check it failed (standing.go:
	// a browser volunteer's result decides a shard of an open pool only
	// at StandingAfter).
	Standing int `cbor:"standing,omitempty" json:"standing,omitempty"`
	// Extra: reports agreeing with a shard already verified (no credit).
	Extra int `cbor:"extra" json:"extra"`
	// Inconclusive: reports on shards flagged unverified.
	Inconclusive int `cbor:"inconclusive" json:"inconclusive"`
	// WorkUnits: verified work credited, as in receipt.Contributions.
	WorkUnits int64 `cbor:"work_units" json:"work_units"`
	// Expired: leases that ran out without a report (the peer timed out).
	Expired int `cbor:"expired,omitempty" json:"expired"`
	// Released: leases the peer handed back without a report. A peer that
	// keeps taking shards it does not run shows here (lease churn).
	Released int `cbor:"released,omitempty" json:"released"`
	// RoundsOnly: the peer's last lease asked for training rounds alone
	// (Lease.Kinds), as a silo whose policy refuses generic shards does.
	// Such a peer is never drawn to audit a generic shard (spotcheck.go).
	RoundsOnly bool `cbor:"rounds_only,omitempty" json:"rounds_only,omitempty"`
	// Record is the peer's verified behaviour in adaptive jobs: its
	// streak of valid checks, failed checks, offences and exclusion
	// (spot.Observe).
	spot.Record
	// SweptAt is when the peer's accepted results were last re-checked
	// after it was caught.
	SweptAt int64 `cbor:"swept_at,omitempty" json:"swept_at,omitempty"`
}

func (s *shardState) leaseOf(peer string) (int, bool) {
	i := sort.Search(len(s.Leases), func(i int) bool { return s.Leases[i].Peer >= peer })
	return i, i < len(s.Leases) && s.Leases[i].Peer == peer
}

func (s *shardState) reportOf(peer string) *report {
	for i := range s.Reports {
		if s.Reports[i].Peer == peer {
			return &s.Reports[i]
		}
	}
	return nil
}

func (s *shardState) held(peer string) bool {
	i := sort.SearchStrings(s.Holders, peer)
	return i < len(s.Holders) && s.Holders[i] == peer
}

// addLease records a new live lease for peer (who holds none on s).
func (s *shardState) addLease(peer string, expiry int64) {
	i, _ := s.leaseOf(peer)
	s.Leases = append(s.Leases, lease{})
	copy(s.Leases[i+1:], s.Leases[i:])
	s.Leases[i] = lease{Peer: peer, Expiry: expiry}
	if j := sort.SearchStrings(s.Holders, peer); j == len(s.Holders) || s.Holders[j] != peer {
		s.Holders = append(s.Holders, "")
		copy(s.Holders[j+1:], s.Holders[j:])
		s.Holders[j] = peer
	}
}

func (s *shardState) dropLease(i int) {
	s.Leases = append(s.Leases[:i], s.Leases[i+1:]...)
	if len(s.Leases) == 0 {
		s.Leases = nil
	}
}

func (m *Machine) peer(name string) *PeerRecord {
	if m.st.Peers == nil {
		m.st.Peers = map[string]*PeerRecord{}
	}
	p := m.st.Peers[name]
	if p == nil {
		p = &PeerRecord{Peer: name}
		m.st.Peers[name] = p
	}
	return p
}
