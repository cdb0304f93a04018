package studio

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
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
	values  map[content.Ref]any                      // decided result → decoded value
	rounds  map[content.Ref]*fl.RoundResult          // round result blob
	records map[content.Ref]*silo.SignedContribution // contribution record
	recOK   map[content.Ref]bool                     // its signature verified
	plans   map[content.Ref]*Plan                    // job → plan (nil: not a sweep)
	log     *slog.Logger
}

func newCache(log *slog.Logger) *cache {
	return &cache{log: log, values: map[content.Ref]any{}, rounds: map[content.Ref]*fl.RoundResult{},
		records: map[content.Ref]*silo.SignedContribution{}, recOK: map[content.Ref]bool{}, plans: map[content.Ref]*Plan{}}
}

// full is the unfiltered picture with everything any viewer may see; a
// viewer's picture is cut from it (forViewer).
type full struct {
	Picture
	ledger []LedgerEntry // every silo's records
}

// build reads the source into a picture. Expensive reads (plans, blobs)
// are cached; one that fails is retried on the next build.
func (c *cache) build(ctx context.Context, src Source, fed *identity.Federation) *full {
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
		rv := RunView{ID: rs.ID, Name: rs.Name, State: rs.State, Rounds: rs.Rounds, Silos: rs.Silos, Reason: rs.Reason, StartedAt: rs.StartedAt, Done: []RoundView{}}
		for i, jobID := range rs.Jobs {
			js, err := src.Job(jobID)
			if err != nil {
				continue
			}
			var rr *fl.RoundResult
			if i < len(rs.Models) {
				rr = c.round(ctx, src, rs.Models[i])
			}
			if rr == nil {
				if i == len(rs.Jobs)-1 && rs.State == coordinator.RunRunning {
					if jv, ok := c.job(ctx, src, jobID, false); ok {
						rv.Current = &jv
					}
				}
				continue
			}
			sum := fl.NewRoundSummary(rr.Round, rr.Step, rr.Participants, rr.Dropped, rr.Metrics, rr.Model)
			round := RoundView{Round: sum.Round, Step: sum.Step, Participants: sum.Participants, Dropped: sum.Dropped,
				Epsilon: map[string]float64{}, Declined: map[string]string{}, StartedAt: js.SubmittedAt, DoneAt: js.DoneAt}
			if sum.Sums["examples"] > 0 {
				round.TrainLoss, round.TrainAcc = num(sum.TrainLoss), num(sum.TrainAcc)
			}
			if sum.EvalRows > 0 {
				round.EvalLoss, round.EvalAcc = num(sum.EvalLoss), num(sum.EvalAcc)
			}
			for _, s := range js.Shards {
				if s.State != coordinator.StateVerified || s.Result == "" {
					continue // undecided or flagged: nothing to read (law 13)
				}
				rec, ok := c.record(ctx, src, fed, s.Result)
				if !ok {
					continue
				}
				r := rec.Record
				entry := LedgerEntry{Silo: r.Silo, Dataset: r.Dataset, Run: rs.Name, Round: rr.Round, Status: r.Status, Epsilon: r.Epsilon,
					Cumulative: r.Cumulative, Delta: r.Delta, Budget: r.Budget, LedgerEntry: r.LedgerEntry, LedgerSeq: r.LedgerSeq,
					LedgerHead: r.LedgerHead, Mechanisms: len(r.Mechanisms), Verified: c.recOK[s.Result], Record: s.Result}
				for _, ref := range r.Refusals {
					entry.Refusals = append(entry.Refusals, string(ref.Code))
				}
				f.ledger = append(f.ledger, entry)
				key := [2]string{r.Silo, r.Dataset}
				row := privacy[key]
				if row == nil {
					row = &PrivacyRow{Silo: r.Silo, Dataset: r.Dataset, Verified: true}
					privacy[key] = row
					order = append(order, key)
				}
				row.Verified = row.Verified && entry.Verified
				switch r.Status {
				case silo.Contributed:
					round.Epsilon[r.Silo] = r.Epsilon
				default:
					reason := r.Status
					if len(r.Refusals) > 0 {
						reason = string(r.Refusals[0].Code) + " " + r.Refusals[0].Message
					}
					round.Declined[r.Silo] = reason
					row.Declined++
				}
				if r.LedgerEntry != "" {
					row.Charges++
					row.Run, row.Round, row.RoundEps = rs.Name, rr.Round, r.Epsilon
				}
				if r.Budget > 0 {
					row.Cumulative, row.Delta, row.Budget = r.Cumulative, r.Delta, r.Budget
					row.Remaining = math.Max(0, r.Budget-r.Cumulative)
				}
			}
			rv.Done = append(rv.Done, round)
		}
		p.Runs = append(p.Runs, rv)
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

func (c *cache) round(ctx context.Context, src Source, ref content.Ref) *fl.RoundResult {
	if rr, ok := c.rounds[ref]; ok {
		return rr
	}
	b, err := src.Blob(ctx, ref)
	if err != nil {
		return nil
	}
	rr, _, err := fl.DecodeRoundResult(b)
	if err != nil {
		return nil
	}
	c.rounds[ref] = rr
	return rr
}

func (c *cache) record(ctx context.Context, src Source, fed *identity.Federation, ref content.Ref) (*silo.SignedContribution, bool) {
	if r, ok := c.records[ref]; ok {
		return r, true
	}
	b, err := src.Blob(ctx, ref)
	if err != nil {
		return nil, false
	}
	r, err := silo.DecodeContribution(b)
	if err != nil {
		return nil, false
	}
	c.records[ref] = r
	c.recOK[ref] = r.Verify(fed) == nil
	return r, true
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
	return p
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
