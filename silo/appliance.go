package silo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/pool"
)

// Appliance is a running silo: `scellis silo`. It leases its training
// rounds' shards in a lane of their own (pool.Lane) and hands them to the
// round handler (HandleRound); only when its policy takes generic shards
// does it lease them too, in a second lane of at most Parallel-1 shards
// beside the first, and run them as a worker does. So a round is never
// queued behind generic work, and the pool never grants the silo a shard
// it would hand back.
//
// Invariant (law 6): for every round it takes part in, the ledger entry
// paying for the update is durable before the update — masked — leaves the
// process; the update itself is never logged nor stored outside the silo.
type Appliance struct {
	Name    string
	ID      *identity.Identity
	Fed     *identity.Federation
	Config  *config.Silo
	Client  *api.Client
	Catalog *catalog.Catalog // the silo's own catalog (its built-ins)
	Ledger  *dp.Ledger
	Policy  Policy // pinned to Catalog
	Rounds  *MemoryRoundLog
	Data    map[string]*model.Dataset

	// Parent, for a silo led by a child cluster (config
	// parent_federation), is the parent cluster it checks every
	// hierarchical round with before taking part (parent.go); nil: none.
	Parent *Parent
	// SecAgg lists the base URLs ("https://host:port") of the aggregators
	// that may host a round's secure aggregation; the silo takes part on
	// the first that has the round open. Default: every aggregator of the
	// federation.
	SecAgg []string
	// HTTP is the client secure aggregation runs over (mutual TLS as the
	// silo, pinned to the federation's aggregators).
	HTTP *http.Client
	// DataPlane, when set, moves the silo's blobs and secure-aggregation
	// messages over data channels, HTTPS being the last fallback
	// (dataplane.go); nil: HTTPS only.
	DataPlane *dataplane.Blobs
	// RoundTimeout bounds one round at the silo (client step and secure
	// aggregation); default 10 minutes.
	RoundTimeout time.Duration
	// Poll is the pause after a failed lease request, and between probes
	// for a round's host; default 500 ms.
	Poll time.Duration
	// LongPoll is how long the leader may hold an empty lease request
	// (api.LeaseRequest.WaitMS): a new round's shard reaches the silo as
	// soon as it is planned, and the polls are the silo's heartbeat
	// (config poll; default 2 s).
	LongPoll time.Duration
	// Parallel is how many rounds the silo works on at once, and one
	// more than the generic shards it runs beside them (when its policy
	// takes them); default 4.
	Parallel int
	// Now is the clock for the round log; nil means time.Now.
	Now func() time.Time
	// Logf receives progress lines for people; nil is silent. Lines never
	// hold an update, metrics or data.
	Logf func(format string, args ...any)

	once   sync.Once
	worker *pool.Worker
	// rounds holds one lock per ledger consumer (a run's round): two
	// attempts of one round — an abandoned one still finishing and its
	// retry — must not both find the round unpaid and both charge.
	rounds     sync.Map // consumer → chan struct{} (capacity 1)
	metrics    *siloMetrics
	transports sync.Map // aggregator member → its secure-aggregation transport (dataplane.go)
	runCache   runBlobs // run specs and strategies by ref (blobcache.go)
}

// Options tune Open.
type Options struct {
	// LedgerNow is the ledger's clock (tests); nil means time.Now.
	LedgerNow func() time.Time
	Logf      func(format string, args ...any)
}

// Open sets a silo up from its config, identity and federation: checks it
// is the federation's silo member of that key, opens (or creates) its
// privacy ledger signed with the identity key and declares every dataset's
// budget there (once; a declared budget is never changed), loads its
// datasets, pins its policy to its built-in catalog and rebuilds its round
// log from the ledger's round charges. Every problem found is returned as
// diagnostics.
func Open(c *config.Silo, id *identity.Identity, fed *identity.Federation, opt Options) (*Appliance, error) {
	m, ok := fed.Lookup(id.Public())
	switch {
	case !ok || m.Name != c.Name:
		return nil, diag.New(diag.WorkerConfig, c.Name, "the identity key does not belong to member %q of %s", c.Name, fed.File).
			At(c.File, 1, 1).WithHelp("set name to the member whose public key matches the identity file, or add the silo to the federation file")
	case m.Role != identity.Silo:
		return nil, diag.New(diag.WorkerConfig, c.Name, "member %q is a %s in %s, not a silo", c.Name, m.Role, fed.File).
			At(c.File, 1, 1).WithHelp("the federation's operator lists the silo with role: silo")
	}
	// Before anything is created: a parent_federation that does not list
	// the silo under a child cluster refuses the config (SC7610).
	parent, err := OpenParent(c, id)
	if err != nil {
		return nil, err
	}
	a := &Appliance{Name: c.Name, ID: id, Fed: fed, Config: c, Parent: parent, Rounds: &MemoryRoundLog{}, Data: map[string]*model.Dataset{}, Logf: opt.Logf}
	if a.Catalog, err = catalog.Builtin(); err != nil {
		return nil, err
	}
	var ds diag.List
	for _, d := range c.Datasets {
		data, err := model.LoadCSV(d.Path, d.Label)
		if err != nil {
			ds = append(ds, asDiags(err, diag.CSVUnreadable, "dataset "+d.Name, "check the dataset's path and label column")...)
			continue
		}
		// Raw rows: each run standardises them as it declares (federated
		// statistics, the silo's own, or none), per round (runData).
		data.Name = d.Name
		a.Data[d.Name] = data
	}
	a.Policy, err = NewPolicy(c, a.Rounds).Pin(a.Catalog)
	if err != nil {
		ds = append(ds, asDiags(err, diag.UnknownContent, "policy.strategies", "")...)
	}
	if len(ds) > 0 {
		return nil, ds
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, diag.New(diag.WorkerConfig, c.Name, "cannot make data_dir %s: %v", c.DataDir, err).WithHelp("check data_dir in the silo config")
	}
	if a.Ledger, err = openLedger(c, id, opt.LedgerNow); err != nil {
		return nil, err
	}
	if err := a.declareBudgets(); err != nil {
		a.Ledger.Close()
		return nil, err
	}
	if err := a.rebuildRoundLog(); err != nil {
		a.Ledger.Close()
		return nil, err
	}
	if a.Client, err = api.NewClient(id, fed); err != nil {
		a.Ledger.Close()
		return nil, err
	}

	for _, agg := range fed.ByRole(identity.Aggregator) {
		if agg.Address != "" {
			a.SecAgg = append(a.SecAgg, "https://"+agg.Address)
		}
	}
	cfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
	if err != nil {
		a.Ledger.Close()
		return nil, err
	}
	a.metrics = newSiloMetrics(a)
	a.HTTP = &http.Client{Transport: a.metrics.countTransport(api.Transport(cfg))}
	return a, nil
}

// declareBudgets declares each config dataset's budget in the ledger,
// unless the ledger already holds one (then the smaller binds, see
// Policy.CheckRound).
func (a *Appliance) declareBudgets() error {
	snap, err := a.Ledger.Snapshot()
	if err != nil {
		return err
	}
	for _, d := range a.Config.Datasets {
		if st, ok := snap.Dataset(d.Name); ok {
			if st.Budget != d.Budget.Epsilon || st.Delta != d.Budget.Delta {
				a.logf("dataset %s: the ledger's budget ε = %g at δ = %g stands (the config says ε = %g at δ = %g; the smaller ε binds, a budget is never raised)",
					d.Name, st.Budget, st.Delta, d.Budget.Epsilon, d.Budget.Delta)
			}
			continue
		}
		if _, err := a.Ledger.DeclareBudget(d.Name, d.Budget.Epsilon, d.Budget.Delta); err != nil {
			return err
		}
		a.logf("dataset %s: declared budget ε = %g at δ = %g in the ledger", d.Name, d.Budget.Epsilon, d.Budget.Delta)
	}
	return nil
}

// Consumer is the ledger consumer of one round: "<run>/round-<r>".
func Consumer(run string, round int) string { return fmt.Sprintf("%s/round-%d", run, round) }

// parseConsumer is Consumer's inverse.
func parseConsumer(s string) (RoundKey, bool) {
	i := strings.LastIndex(s, "/round-")
	if i <= 0 {
		return RoundKey{}, false
	}
	r, err := strconv.Atoi(s[i+len("/round-"):])
	if err != nil || r < 0 {
		return RoundKey{}, false
	}
	return RoundKey{Run: s[:i], Round: r}, true
}

// rebuildRoundLog records every round the ledger charged, and every round
// the round journal noted as accepted (declined afterwards for an error, or
// taken part in without DP), over the last Day, so max_rounds_per_day holds
// across restarts.
func (a *Appliance) rebuildRoundLog() error {
	snap, err := a.Ledger.Snapshot()
	if err != nil {
		return err
	}
	since := a.now().Add(-Day)
	if err := a.readRoundJournal(since); err != nil {
		return diag.New(diag.SiloStateUnavailable, a.Config.DataDir, "cannot read the round journal: %v", err)
	}
	for _, e := range snap.Entries() {
		if e.Kind != dp.KindCharge || e.Charge == nil || e.At().Before(since) {
			continue
		}
		if k, ok := parseConsumer(e.Charge.Consumer); ok {
			a.Rounds.Record(k, e.At())
		}
	}
	return nil
}

func (a *Appliance) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Appliance) logf(format string, args ...any) {
	if a.Logf != nil {
		a.Logf(format, args...)
	}
}

// Close closes the ledger.
func (a *Appliance) Close() error {
	if a.Ledger == nil {
		return nil
	}
	return a.Ledger.Close()
}

// Worker returns the pool worker the silo leases with and runs generic
// shards through (pool.Worker.RunGrant).
func (a *Appliance) Worker() *pool.Worker {
	a.once.Do(func() {
		poll := a.Poll
		if poll <= 0 {
			poll = 500 * time.Millisecond
		}
		a.Poll = poll
		if a.LongPoll <= 0 {
			a.LongPoll = 2 * time.Second
		}
		par := a.Parallel
		if par <= 0 {
			par = 4
		}
		a.worker = &pool.Worker{
			Client: a.Client, Name: a.Name, Identity: a.ID, Catalog: a.Catalog, CacheDir: filepath.Join(a.Config.DataDir, "cache"),
			Parallel: par, Poll: poll, LongPoll: a.LongPoll, Logf: a.Logf, Observe: a.metrics.observeShard,
			Lanes: a.lanes(par),
			// Generic shards (the only ones RunGrant sees here) run as an
			// isolating worker's do, in child processes under its memory
			// and time limits — away from the silo's data and keys — and
			// at the lowest CPU priority: a round's work always comes
			// first on the silo's cores.
			MemoryBytes: config.DefaultShardMemoryMB << 20, ProcessMemoryBytes: config.DefaultShardMemoryMB<<20 + pool.ChildOverhead,
			ShardTimeout: config.DefaultShardTimeout, ProcessNice: GenericNice,
		}
		if a.DataPlane != nil {
			a.worker.Blobs = a.DataPlane // contribution records, generic shards' blobs
		}
	})
	return a.worker
}

// Run delivers the records left in the outbox (outbox.go), then leases
// and works until ctx ends (SIGINT), hands every lease back and returns nil.
func (a *Appliance) Run(ctx context.Context) error {
	a.Worker() // sets Poll
	a.flushOutbox(ctx)
	return a.Worker().Run(ctx)
}

// GenericNice is the niceness of the child processes that run a silo's
// generic shards: the lowest CPU priority.
const GenericNice = 19

// lanes are the silo's lease loops: its rounds, and generic work beside
// them only when the policy takes it — one slot fewer than par, so a
// round is never queued behind generic work for a slot (its own lane)
// nor for a core (the children's niceness).
func (a *Appliance) lanes(par int) []pool.Lane {
	lanes := []pool.Lane{{Kinds: coordinator.Kinds{coordinator.KindRound}, Parallel: par, Dispatch: a.Dispatch}}
	if a.Policy.GenericShards {
		lanes = append(lanes, pool.Lane{Kinds: coordinator.Kinds{coordinator.KindGeneric}, Parallel: max(par-1, 1), Dispatch: a.runGeneric})
	}
	return lanes
}

// Dispatch handles one leased round shard: it goes to HandleRound. A
// grant of anything else (which the pool, asked for rounds alone, does
// not make) is handed back.
func (a *Appliance) Dispatch(ctx context.Context, g coordinator.LeaseGrant) {
	w := a.Worker()
	var st coordinator.JobStatus
	if l, ok := w.TakeLeased(g.Job); ok {
		// A round job, as the lease response described it: no status
		// read on the round's path (issue 19).
		st = coordinator.JobStatus{ID: l.Job, Bundle: l.Bundle, Policy: l.Policy, Run: l.Run, Round: l.Round, State: coordinator.JobRunning, Delegated: l.Delegated}
	} else {
		jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var err error
		st, err = a.Client.Job(jctx, g.Job)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.ReleaseGrant(g, fmt.Errorf("reading the job: %w", err))
			}
			return
		}
	}
	if st.Run == "" {
		w.ReleaseGrant(g, errors.New("the pool granted a generic shard to the silo's round lane; it asks for rounds alone"))
		return
	}
	// The job's policy is known now: reporting does not ask again.
	w.KnowPolicy(g.Job, st.Policy)
	a.metrics.countLease(coordinator.KindRound)
	a.HandleRound(ctx, g, st)
}

// runGeneric runs one shard of the generic lane, as a worker does.
func (a *Appliance) runGeneric(ctx context.Context, g coordinator.LeaseGrant) {
	a.metrics.countLease(coordinator.KindGeneric)
	a.Worker().RunGrant(ctx, g)
}
