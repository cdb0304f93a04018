package coordinator

import (
	"math"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// DefaultLeaseTTL is the lease duration (ms) when neither the command, the
// job nor the Config gives one.
const DefaultLeaseTTL int64 = 60_000

// MaxShards bounds the shards of one job, so one submission cannot make
// the replicated state unboundedly large.
const MaxShards = 1 << 20

// Config fixes a machine's pool. It is part of the state (and of every
// snapshot), so all replicas must start from the same Config.
type Config struct {
	// Regime is the pool's trust regime; every job is admitted against it.
	Regime trust.Regime
	// DefaultLeaseTTL is the lease duration in ms for jobs whose policy
	// gives none; 0 means DefaultLeaseTTL.
	DefaultLeaseTTL int64
	// CommitReveal refuses any result report that does not open an earlier
	// commitment of the same peer (commit.go). Aggregators always set it;
	// a pool without it exists to measure what it costs.
	CommitReveal bool
	// SignedReports refuses any result report or verdict that is not
	// signed by its peer's key (signed.go). Aggregators always set it.
	SignedReports bool
}

// Machine is the coordinator state machine. Apply changes it; the query
// methods read it. It is safe for concurrent use: Apply calls are
// serialised, queries may run alongside each other, and every query
// returns copies the caller may keep.
type Machine struct {
	mu sync.RWMutex
	// st.Receipts is the receipt chain: it is kept once, in the replicated
	// state, and extended only by mint.
	st   state
	jobs map[string]*jobState // by job ID
	// results indexes every report by its result hash: the shards that
	// reported it (ResultUse, asked at every blob read), so a read does
	// not scan the reports of every job the pool ever ran. Derived from
	// st, never snapshotted.
	results map[content.Ref][]shardAt
	// nextExpiry is a lower bound on the earliest live lease's expiry
	// (math.MinInt64 forces the next clock advance to scan).
	nextExpiry int64
	// preverified holds, while a batch applies, the verdicts of its
	// reports' signatures checked ahead in parallel (signed.go).
	preverified map[sigCheck]bool
}

// New returns an empty machine for a pool of cfg.Regime. It refuses an
// unknown regime or a negative TTL.
func New(cfg Config) (*Machine, error) {
	if _, err := trust.ParseRegime(string(cfg.Regime)); err != nil {
		return nil, err
	}
	if cfg.DefaultLeaseTTL < 0 || cfg.DefaultLeaseTTL > MaxLeaseTTL {
		return nil, diag.New(diag.InvalidValue, "coordinator",
			"default lease TTL %d ms outside 0 to %d", cfg.DefaultLeaseTTL, MaxLeaseTTL)
	}
	if cfg.DefaultLeaseTTL == 0 {
		cfg.DefaultLeaseTTL = DefaultLeaseTTL
	}
	m := &Machine{}
	m.st = state{Format: snapshotFormat, Regime: cfg.Regime, DefaultLeaseTTL: cfg.DefaultLeaseTTL, CommitReveal: cfg.CommitReveal, SignedReports: cfg.SignedReports}
	m.jobs = map[string]*jobState{}
	m.results = map[content.Ref][]shardAt{}
	m.nextExpiry = math.MaxInt64
	return m, nil
}

// Apply applies one command and returns its response, events and refusal.
// It is deterministic: the same commands applied in the same order to
// machines in the same state give the same results and the same state.
//
// Responses by command: SubmitJob → *SubmitResponse, Lease →
// *LeaseResponse, RenewLease → *RenewResponse, ReleaseLeases →
// *ReleaseResponse, Tick → *TickResponse, ReportResult → *ReportResponse,
// ReportReduced → *ReducedResponse, StartRun → *StartRunResponse, StopRun
// → *StopRunResponse, FlagDropped → *FlagDroppedResponse, RetryRound → *RetryRoundResponse,
// ResumeRun → *StopRunResponse, ChangeMembership → *MembershipResponse, Batch → *BatchResponse (whose Events
// are also concatenated in the Batch's Result).
func (m *Machine) Apply(c Command) Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.apply(c, true)
}

func (m *Machine) apply(c Command, batchOK bool) Result {
	switch c := deref(c).(type) {
	case SubmitJob:
		return m.submit(c)
	case Lease:
		return m.lease(c)
	case RenewLease:
		return m.renew(c)
	case ReleaseLeases:
		return m.release(c)
	case Tick:
		return m.tick(c)
	case CommitResult:
		return m.commit(c)
	case ReportResult:
		return m.report(c)
	case ReportReduced:
		return m.reduced(c)
	case ReportVerdict:
		return m.verdict(c)
	case CancelJob:
		return m.cancel(c)
	case StartRun:
		return m.startRun(c)
	case StopRun:
		return m.stopRun(c)
	case FlagDropped:
		return m.flagDropped(c)
	case RetryRound:
		return m.retryRound(c)
	case ResumeRun:
		return m.resumeRun(c)
	case ChangeMembership:
		return m.changeMembership(c)
	case DrawAudit:
		return m.draw(c)
	case Readmit:
		return m.readmit(c)
	case Batch:
		if !batchOK {
			return refuse(badCommand("batches do not nest"))
		}
		return m.batch(c)
	default:
		return refuse(badCommand("not a coordinator command: %T", c))
	}
}

func (m *Machine) batch(b Batch) Result {
	m.preverify(b)
	defer func() { m.preverified = nil }()
	resp := &BatchResponse{Results: make([]Result, len(b.Commands))}
	var events []Event
	for i, c := range b.Commands {
		r := m.apply(c, false)
		resp.Results[i] = r
		events = append(events, r.Events...)
	}
	return Result{Response: resp, Events: events}
}

// clock returns the effective time of a command: its Now, or the
// machine's clock if that is later. The clock never goes backwards (a new
// leader's clock may lag the old one's), so expiries and receipt times are
// monotone.
func (m *Machine) clock(now int64) int64 {
	return max(now, m.st.Now)
}
