package studio

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/fl/account"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/viz"
)

// Source is what the Studio reads: the node's replica of the coordinator
// state, its blob store, and its event hub. Every aggregator node applies
// the same log, so any node's Source yields the same picture.
type Source interface {
	Jobs() []coordinator.JobStatus
	Job(id content.Ref) (coordinator.JobStatus, error)
	Runs() []coordinator.RunStatus
	Receipts(since uint64) []receipt.Receipt
	Contributions() map[string]int64
	Cluster() Cluster
	// Blob returns a decided result, a round result or other content by
	// hash (fetching it from another node when it is not local). The
	// Studio asks only for results of decided shards (law 13).
	Blob(ctx context.Context, ref content.Ref) ([]byte, error)
	// Plan returns a pool job's shard parameters (in shard order) and the
	// reducer's metric and goal, for laying out its sweep.
	Plan(ctx context.Context, js coordinator.JobStatus) (Plan, error)
	// Subscribe streams every applied event; cancel must be called.
	Subscribe() (<-chan coordinator.Event, func())
}

// Plan is what the Studio needs of a job's plan.
type Plan struct {
	Params []map[string]any
	Metric string // the reducer's metric param, "" if none
	Goal   string // "max" or "min", "" if none
}

// Cluster is one node's view of the cluster's health.
type Cluster struct {
	Node         string      `json:"node"`
	State        string      `json:"state"`
	Leader       string      `json:"leader"`
	Term         uint64      `json:"term"`
	CommitIndex  uint64      `json:"commit_index"`
	AppliedIndex uint64      `json:"applied_index"`
	ChainSeq     uint64      `json:"chain_seq"`
	ChainHead    content.Ref `json:"chain_head"`
	StateHash    content.Ref `json:"state_hash"`
	Servers      []string    `json:"servers"`
	// Nodes is every aggregator as last heard (this one included), so the
	// chain heads can be compared; a node that did not answer is marked.
	Nodes []NodeHealth `json:"nodes,omitempty"`
}

// NodeHealth is one aggregator's Raft state and chain head.
type NodeHealth struct {
	Node         string      `json:"node"`
	Reachable    bool        `json:"reachable"`
	State        string      `json:"state,omitempty"`
	Term         uint64      `json:"term,omitempty"`
	CommitIndex  uint64      `json:"commit_index,omitempty"`
	AppliedIndex uint64      `json:"applied_index,omitempty"`
	ChainSeq     uint64      `json:"chain_seq,omitempty"`
	ChainHead    content.Ref `json:"chain_head,omitempty"`
}

// Picture is everything a viewer sees, as one JSON document; the browser
// redraws from it. Version grows with every picture this node built.
type Picture struct {
	Version  uint64           `json:"version"`
	Viewer   Viewer           `json:"viewer"`
	Cluster  Cluster          `json:"cluster"`
	Jobs     []JobView        `json:"jobs"`
	Runs     []RunView        `json:"runs"`
	Privacy  []PrivacyRow     `json:"privacy"`
	Ledger   []LedgerEntry    `json:"ledger,omitempty"` // the viewer's own silo ledger records
	Receipts ReceiptsView     `json:"receipts"`
	Contrib  map[string]int64 `json:"contributions"`
}

// Viewer is who is watching.
type Viewer struct {
	Member string `json:"member"`
	Role   string `json:"role"`
	Via    string `json:"via"` // "token" or "certificate"
}

// JobView is a pool job: its counts, each shard's state and, for a
// two-parameter sweep, its heatmap.
type JobView struct {
	ID          content.Ref          `json:"id"`
	Name        string               `json:"name"`
	State       coordinator.JobState `json:"state"`
	Regime      trust.Regime         `json:"regime"`
	Submitter   string               `json:"submitter,omitempty"`
	Counts      coordinator.Counts   `json:"counts"`
	SubmittedAt int64                `json:"submitted_at"`
	DoneAt      int64                `json:"done_at,omitempty"`
	Shards      []ShardView          `json:"shards"`
	Grid        *GridView            `json:"grid,omitempty"`
	// Hidden: the viewer may not read this open-pool job's results, so
	// the grid shows which cells are verified but not their values.
	Hidden bool `json:"hidden,omitempty"`
}

// ShardView is one shard's state for the shard strip.
type ShardView struct {
	Index     int                    `json:"i"`
	State     coordinator.ShardState `json:"s"`
	DecidedAt int64                  `json:"d,omitempty"`
	Replaced  bool                   `json:"r,omitempty"` // a loser's report was outvoted
}

// GridView is a sweep's heatmap: axis labels and the cells known so far.
type GridView struct {
	Metric string     `json:"metric"`
	Goal   string     `json:"goal"`
	XName  string     `json:"x_name"`
	YName  string     `json:"y_name"`
	X      []string   `json:"x"`
	Y      []string   `json:"y"`
	Cells  []GridCell `json:"cells"`
	Best   int        `json:"best"` // shard index of the best cell, -1 if none
	Lo     float64    `json:"lo"`
	Hi     float64    `json:"hi"`
}

// GridCell is one shard's place in the grid; Value is set once the shard
// is verified and its result read.
type GridCell struct {
	Shard     int      `json:"shard"`
	X         int      `json:"x"`
	Y         int      `json:"y"`
	State     string   `json:"state"`
	Value     *float64 `json:"value,omitempty"`
	DecidedAt int64    `json:"decided_at,omitempty"`
}

// RunView is a training run: its rounds with their metrics and timing.
type RunView struct {
	ID        content.Ref          `json:"id"`
	Name      string               `json:"name"`
	State     coordinator.RunState `json:"state"`
	Rounds    int                  `json:"rounds"`
	Silos     []string             `json:"silos"`
	Reason    string               `json:"reason,omitempty"`
	StartedAt int64                `json:"started_at"`
	Done      []RoundView          `json:"done"`
	// Current is the round in progress (its shard states), if any.
	Current *JobView `json:"current,omitempty"`
	// CurveNote says why the run has no loss curve to draw (under DP a
	// training round releases no loss; the curve is a charged
	// evaluation's), or what its points are; "" when nothing needs
	// saying (account.CurveNote).
	CurveNote string `json:"curve_note,omitempty"`
}

// RoundView is one completed round of a run.
type RoundView struct {
	Round        int                `json:"round"`
	Step         string             `json:"step"`
	Participants []string           `json:"participants"`
	Dropped      []string           `json:"dropped"`
	TrainLoss    *float64           `json:"train_loss,omitempty"`
	TrainAcc     *float64           `json:"train_accuracy,omitempty"`
	EvalLoss     *float64           `json:"eval_loss,omitempty"`
	EvalAcc      *float64           `json:"eval_accuracy,omitempty"`
	Epsilon      map[string]float64 `json:"epsilon"`
	Declined     map[string]string  `json:"declined"`
	StartedAt    int64              `json:"started_at"`
	DoneAt       int64              `json:"done_at"`
}

// PrivacyRow is one silo's dataset as the privacy report publishes it:
// the ε of its last charged round, its cumulative ε (the silo's ledger,
// RDP-composed), δ, budget and what remains, from the signed contribution
// records the receipts cite.
type PrivacyRow struct {
	Silo       string  `json:"silo"`
	Dataset    string  `json:"dataset"`
	Run        string  `json:"run"`
	Round      int     `json:"round"`
	RoundEps   float64 `json:"round_epsilon"`
	Cumulative float64 `json:"cumulative_epsilon"`
	Delta      float64 `json:"delta"`
	Budget     float64 `json:"budget_epsilon"`
	Remaining  float64 `json:"remaining_epsilon"`
	Charges    int     `json:"charges"`
	Declined   int     `json:"declined"`
	// Verified: every record behind the row carries a valid signature of
	// the silo named in it (federation file).
	Verified bool `json:"verified"`
}

// LedgerEntry is one of a silo's signed contribution records: the charge
// and the ledger entry that paid for it. Only the silo itself sees its
// records in full (its ledger's sequence and head, refusal codes).
type LedgerEntry struct {
	Silo        string      `json:"silo"`
	Dataset     string      `json:"dataset"`
	Run         string      `json:"run"`
	Round       int         `json:"round"`
	Status      string      `json:"status"`
	Epsilon     float64     `json:"epsilon"`
	Cumulative  float64     `json:"cumulative_epsilon"`
	Delta       float64     `json:"delta"`
	Budget      float64     `json:"budget_epsilon"`
	LedgerEntry content.Ref `json:"ledger_entry,omitempty"`
	LedgerSeq   uint64      `json:"ledger_seq,omitempty"`
	LedgerHead  content.Ref `json:"ledger_head,omitempty"`
	Mechanisms  int         `json:"mechanisms"`
	Refusals    []string    `json:"refusals,omitempty"`
	Verified    bool        `json:"verified"`
	Record      content.Ref `json:"record"`
}

// ReceiptsView is the receipt chain's head and its latest receipts.
type ReceiptsView struct {
	Count  int           `json:"count"`
	Head   content.Ref   `json:"head"`
	Recent []ReceiptLine `json:"recent"`
}

// ReceiptLine is one receipt, briefly.
type ReceiptLine struct {
	Seq       uint64   `json:"seq"`
	Job       string   `json:"job"`
	Shard     int      `json:"shard"`
	Peers     []string `json:"peers"`
	WorkUnits int64    `json:"work_units"`
	Method    string   `json:"method"`
	Hash      string   `json:"hash"`
}

// recentReceipts is how many receipts the receipts view lists.
const recentReceipts = 20

// cache keeps what never changes once known: a blob's decoded value is
// fixed by its hash, a job's plan by its ID.
type cache struct {
	values map[content.Ref]any   // decided result → decoded value
	plans  map[content.Ref]*Plan // job → plan (nil: not a sweep)
	// acct reads runs' accounts (it keeps round results, records and
	// their signature checks by hash); runs holds each run's last view.
	acct *account.Reader
	runs map[content.Ref]builtRun
	fed  *identity.Federation
	log  *slog.Logger
}

func newCache(fed *identity.Federation, log *slog.Logger) *cache {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &cache{log: log, fed: fed, values: map[content.Ref]any{}, plans: map[content.Ref]*Plan{}, runs: map[content.Ref]builtRun{}}
}

// full is the unfiltered picture with everything any viewer may see; a
// viewer's picture is cut from it (forViewer).
type full struct {
	Picture
	ledger []LedgerEntry // every silo's records
}

// build reads the source into a picture. Expensive reads (plans, blobs)
// are cached; one that fails is retried on the next build.
func (c *cache) build(ctx context.Context, src Source) *full {
	f := &full{}
	p := &f.Picture
	p.Cluster = src.Cluster()
	p.Contrib = src.Contributions()
	if p.Contrib == nil {
		p.Contrib = map[string]int64{}
	}
	for _, js := range src.Jobs() {
		if js.Run != "" {
			continue // a round: shown with its run
		}
		if jv, ok := c.job(ctx, src, js.ID, true); ok {
			p.Jobs = append(p.Jobs, jv)
		}
	}
	privacy := map[[2]string]*PrivacyRow{}
	var order [][2]string
	for _, rs := range src.Runs() {
		rv, a := c.run(ctx, src, rs)
		p.Runs = append(p.Runs, rv)
		if a == nil {
			continue
		}
		f.ledger = append(f.ledger, ledgerEntries(rs.Name, a.Records)...)
		for _, d := range a.Datasets {
			key := [2]string{d.Silo, d.Dataset}
			row := privacy[key]
			if row == nil {
				row = &PrivacyRow{Silo: d.Silo, Dataset: d.Dataset, Verified: true}
				privacy[key] = row
				order = append(order, key)
			}
			row.add(rs.Name, d)
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i][0] != order[j][0] {
			return order[i][0] < order[j][0]
		}
		return order[i][1] < order[j][1]
	})
	for _, k := range order {
		p.Privacy = append(p.Privacy, *privacy[k])
	}
	// The latest receipts only: the chain's head says how many there are.
	p.Receipts.Count = int(p.Cluster.ChainSeq)
	p.Receipts.Head = p.Cluster.ChainHead
	since := uint64(0)
	if p.Cluster.ChainSeq > recentReceipts {
		since = p.Cluster.ChainSeq - recentReceipts
	}
	recent := src.Receipts(since)
	if n := len(recent); n > 0 {
		p.Receipts.Count, p.Receipts.Head = int(recent[n-1].Seq), recent[n-1].Hash
	}
	for i := len(recent) - 1; i >= 0 && len(p.Receipts.Recent) < recentReceipts; i-- {
		r := recent[i]
		p.Receipts.Recent = append(p.Receipts.Recent, ReceiptLine{Seq: r.Seq, Job: r.Job.Short(), Shard: r.ShardIndex, Peers: r.Peers,
			WorkUnits: r.WorkUnits, Method: r.Method, Hash: r.Hash.Short()})
	}
	return f
}

// run builds a run's view from its account (package account: the
// records privacy report and fl watch read). A run whose account cannot be
// read now (a blob still being fetched) keeps its last view, so a picture
// never shows a run losing its rounds.
func (c *cache) run(ctx context.Context, src Source, rs coordinator.RunStatus) (RunView, *account.Run) {
	rv := RunView{ID: rs.ID, Name: rs.Name, State: rs.State, Rounds: rs.Rounds, Silos: rs.Silos, Reason: rs.Reason, StartedAt: rs.StartedAt, Done: []RoundView{}}
	if c.acct == nil {
		c.acct = account.NewReader(accountSource{src}, c.fed)
	}
	a, err := c.acct.Run(ctx, rs)
	if err == nil {
		var spec *fl.Canonical
		if spec, err = c.acct.Spec(ctx, rs.ID); err == nil {
			rv.CurveNote = account.CurveNote(&spec.Spec, a.Steps)
		}
	}
	if err != nil {
		c.log.Warn("studio: cannot read the run's account yet", "run", rs.ID.Short(), "err", err)
		if last, ok := c.runs[rs.ID]; ok {
			return last.view, last.account
		}
		return rv, nil
	}
	produced := map[content.Ref]bool{}
	for _, s := range a.Steps {
		rv.Done = append(rv.Done, roundView(s))
		produced[s.Result.Job] = true
	}
	if n := len(rs.Jobs); n > 0 && rs.State == coordinator.RunRunning && !produced[rs.Jobs[n-1]] {
		if jv, ok := c.job(ctx, src, rs.Jobs[n-1], false); ok {
			rv.Current = &jv
		}
	}
	c.runs[rs.ID] = builtRun{view: rv, account: a}
	return rv, a
}

// builtRun is a run's last view and the account it was built from.
type builtRun struct {
	view    RunView
	account *account.Run
}

// roundView is one completed step as the run view draws it.
func roundView(s account.Step) RoundView {
	sum := s.Summary
	round := RoundView{Round: sum.Round, Step: sum.Step, Participants: sum.Participants, Dropped: sum.Dropped,
		Epsilon: sum.Epsilon, Declined: sum.Declined, StartedAt: s.SubmittedAt, DoneAt: s.DoneAt}
	if sum.Sums["examples"] > 0 {
		round.TrainLoss, round.TrainAcc = num(sum.TrainLoss), num(sum.TrainAcc)
	}
	if sum.EvalRows > 0 {
		round.EvalLoss, round.EvalAcc = num(sum.EvalLoss), num(sum.EvalAcc)
	}
	return round
}

// ledgerEntries are a run's records as a silo's own ledger view lists them.
func ledgerEntries(run string, recs []account.Record) []LedgerEntry {
	out := make([]LedgerEntry, 0, len(recs))
	for _, r := range recs {
		e := LedgerEntry{Silo: r.Silo, Dataset: r.Dataset, Run: run, Round: r.Round, Status: r.Status, Epsilon: r.Epsilon,
			Cumulative: r.Cumulative, Delta: r.Delta, Budget: r.Budget, LedgerEntry: r.LedgerEntry, LedgerSeq: r.LedgerSeq,
			LedgerHead: r.LedgerHead, Mechanisms: len(r.Mechanisms), Verified: r.Verified, Record: r.Ref}
		for _, ref := range r.Refusals {
			e.Refusals = append(e.Refusals, string(ref.Code))
		}
		out = append(out, e)
	}
	return out
}

// add counts one run's cost to a silo's dataset into its privacy row: the
// charges and declines add up over runs, the last charge and the ledger's
// cumulative ε (the largest its records state) are the latest.
func (row *PrivacyRow) add(run string, d account.Dataset) {
	row.Verified = row.Verified && d.Verified
	row.Charges += d.Rounds
	row.Declined += d.Declined
	if n := len(d.Charges); n > 0 {
		row.Run, row.Round, row.RoundEps = run, d.Charges[n-1].Round, d.Charges[n-1].Epsilon
	}
	if d.Delta > 0 {
		row.Delta = d.Delta
	}
	if d.Budget > 0 && d.LedgerEps >= row.Cumulative {
		row.Cumulative, row.Budget = d.LedgerEps, d.Budget
		row.Remaining = math.Max(0, d.Budget-d.LedgerEps)
	}
}

// accountSource reads accounts from the node's replica.
type accountSource struct{ src Source }

func (a accountSource) Job(_ context.Context, id content.Ref) (coordinator.JobStatus, error) {
	return a.src.Job(id)
}

func (a accountSource) Blob(ctx context.Context, ref content.Ref) ([]byte, error) {
	return a.src.Blob(ctx, ref)
}

func num(v float64) *float64 { return &v }

// job builds a job's view; grid lays out its sweep when it is one.
func (c *cache) job(ctx context.Context, src Source, id content.Ref, grid bool) (JobView, bool) {
	js, err := src.Job(id)
	if err != nil {
		return JobView{}, false
	}
	jv := JobView{ID: js.ID, Name: js.Name, State: js.State, Regime: js.Regime, Submitter: js.Submitter, Counts: js.Counts,
		SubmittedAt: js.SubmittedAt, DoneAt: js.DoneAt, Shards: make([]ShardView, len(js.Shards))}
	for i, s := range js.Shards {
		jv.Shards[i] = ShardView{Index: s.Index, State: s.State, DecidedAt: s.DecidedAt, Replaced: len(s.Losers) > 0}
	}
	if grid && len(js.Shards) >= 4 {
		jv.Grid = c.grid(ctx, src, js)
	}
	return jv, true
}

// grid lays a job's verified results out over its two parameters.
func (c *cache) grid(ctx context.Context, src Source, js coordinator.JobStatus) *GridView {
	pl, known := c.plans[js.ID]
	if !known {
		got, err := src.Plan(ctx, js)
		if err != nil {
			c.log.Warn("studio: cannot lay out the sweep", "job", js.ID.Short(), "err", err)
			return nil // retried on the next build
		}
		pl = &got
		if len(pl.Params) != len(js.Shards) {
			pl = nil
		}
		c.plans[js.ID] = pl
	}
	if pl == nil {
		return nil
	}
	g, ok := viz.NewGrid(pl.Params, "")
	if !ok {
		c.plans[js.ID] = nil
		return nil
	}
	gv := &GridView{XName: g.XName, YName: g.YName, Best: -1, Metric: pl.Metric, Goal: pl.Goal}
	for _, x := range g.X {
		gv.X = append(gv.X, label(x))
	}
	for _, y := range g.Y {
		gv.Y = append(gv.Y, label(y))
	}
	first := true
	for _, s := range js.Shards {
		x, y := g.Pos(pl.Params[s.Index])
		cell := GridCell{Shard: s.Index, X: x, Y: y, State: string(s.State)}
		if s.State == coordinator.StateVerified && s.Result != "" {
			cell.DecidedAt = s.DecidedAt
			if v, ok := c.value(ctx, src, s.Result); ok {
				if m, isMap := v.(map[string]any); isMap {
					if gv.Metric == "" {
						gv.Metric = viz.PickMetric(m, "")
					}
					if f, ok := viz.Number(m[gv.Metric]); ok {
						cell.Value = &f
					}
				} else if f, ok := viz.Number(v); ok {
					cell.Value = &f
				}
			}
		}
		if cell.Value != nil {
			v := *cell.Value
			if first {
				gv.Lo, gv.Hi = v, v
				first = false
			}
			gv.Lo, gv.Hi = math.Min(gv.Lo, v), math.Max(gv.Hi, v)
		}
		gv.Cells = append(gv.Cells, cell)
	}
	if gv.Goal == "" {
		gv.Goal = "max"
		if slices.Contains([]string{"rmse", "log_loss", "loss", "error", "mse"}, gv.Metric) {
			gv.Goal = "min"
		}
	}
	best := math.NaN()
	for _, cell := range gv.Cells {
		if cell.Value == nil {
			continue
		}
		v := *cell.Value
		if math.IsNaN(best) || (gv.Goal == "min" && v < best) || (gv.Goal != "min" && v > best) {
			best, gv.Best = v, cell.Shard
		}
	}
	return gv
}

func label(v any) string {
	if f, ok := viz.Number(v); ok {
		return trimFloat(f)
	}
	s, _ := v.(string)
	return s
}

func (c *cache) value(ctx context.Context, src Source, ref content.Ref) (any, bool) {
	if v, ok := c.values[ref]; ok {
		return v, true
	}
	b, err := src.Blob(ctx, ref)
	if err != nil {
		return nil, false
	}
	var v any
	if err := content.Decode(b, &v); err != nil {
		return nil, false
	}
	c.values[ref] = v
	return v, true
}

// forViewer cuts a viewer's picture from the full one: values of an
// open-pool job's results only for its submitter and operators (as the
// blob endpoint decides), and a silo's full ledger records only for that
// silo.
func (f *full) forViewer(v Viewer, m identity.Member) Picture {
	p := f.Picture
	p.Viewer = v
	p.Jobs = make([]JobView, len(f.Jobs))
	for i, jv := range f.Jobs {
		if jv.Regime == trust.Open && m.Role != identity.Operator && m.Role != identity.Aggregator && jv.Submitter != m.Name && jv.Grid != nil {
			g := *jv.Grid
			g.Cells = slices.Clone(g.Cells)
			for k := range g.Cells {
				g.Cells[k].Value = nil
			}
			g.Best, g.Lo, g.Hi = -1, 0, 0
			jv.Grid, jv.Hidden = &g, true
		}
		p.Jobs[i] = jv
	}
	p.Ledger = f.ledgerOf(m.Name)
	p.Runs = declinesFor(f.Runs, m.Name)
	return p
}

// declinesFor cuts the rounds' decline reasons for viewer: a silo's
// refusal codes and messages (why it declined: its policy, its budget)
// are its own records, shown to that silo only; every other viewer sees
// that it declined, not why. Before, every viewer saw every silo's codes.
func declinesFor(runs []RunView, viewer string) []RunView {
	out := make([]RunView, len(runs))
	for i, rv := range runs {
		rv.Done = slices.Clone(rv.Done)
		for k, round := range rv.Done {
			if len(round.Declined) == 0 {
				continue
			}
			cut := make(map[string]string, len(round.Declined))
			for s, why := range round.Declined {
				if s != viewer && isCode(strings.Fields(why + " ")[0]) {
					why = silo.Declined
				}
				cut[s] = why
			}
			rv.Done[k].Declined = cut
		}
		out[i] = rv
	}
	return out
}

// ledgerOf returns one silo's records.
func (f *full) ledgerOf(name string) []LedgerEntry {
	var out []LedgerEntry
	for _, e := range f.ledger {
		if e.Silo == name {
			out = append(out, e)
		}
	}
	return out
}

// isCode reports whether s is a diagnostic code ("SC" and four digits).
func isCode(s string) bool {
	if len(s) != 6 || !strings.HasPrefix(s, "SC") {
		return false
	}
	for _, r := range s[2:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
