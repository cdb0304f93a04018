package fl

import (
	"fmt"
	"maps"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/secagg"
)

// RoundBundle is everything a silo needs for one round of a run. The
// aggregator stores it as a blob; its ref is the round job's Bundle, so the
// silo finds it from the job it leased. Everything in it is a hash or a
// parameter: the global model, the run spec and the strategy are blobs.
//
// The vector a silo secure-aggregates is its update (UpdateDim values)
// followed by its metrics in the order of Metrics (missing ones are 0), with
// its weight in secure aggregation's weight coordinate. The reducer splits
// the sum the same way.
type RoundBundle struct {
	Format    string        `cbor:"format" json:"format"`
	Run       content.Ref   `cbor:"run" json:"run"` // the canonical run spec blob
	Round     int           `cbor:"round" json:"round"`
	Strategy  content.Ref   `cbor:"strategy" json:"strategy"` // catalog entry ref
	Global    content.Ref   `cbor:"global" json:"global"`     // Global.Encode() blob
	UpdateDim int           `cbor:"update_dim" json:"update_dim"`
	Metrics   []string      `cbor:"metrics" json:"metrics"`
	SecAgg    secagg.Params `cbor:"secagg" json:"secagg"`
	Seed      int64         `cbor:"seed" json:"seed"`
	// Step is the kind of step (StepStats, StepTrain, StepEval); empty
	// means a training round. TrainRound is a training round's number as
	// the strategy sees it (params.round).
	Step       string `cbor:"step,omitempty" json:"step,omitempty"`
	TrainRound int    `cbor:"train_round,omitempty" json:"train_round,omitempty"`
	// Std is how the silo standardises its features this round: for
	// federated statistics, the global standardiser the statistics step
	// produced. Nil before that step has run.
	Std *Standardization `cbor:"std,omitempty" json:"std,omitempty"`
	// Work is the fraction of its local work each straggler of the round
	// may do (params work; absent silos do all of it).
	Work map[string]float64 `cbor:"work,omitempty" json:"work,omitempty"`
	// Reducer is the aggregator member whose secure-aggregation host
	// (wire.Prefix on its API address) runs the round: the leader that
	// planned it. Its state is in that process's memory only.
	Reducer string `cbor:"reducer,omitempty" json:"reducer,omitempty"`
	// Base is, in a buffered-asynchronous run (RunSpec.Buffer), the stale
	// global a silo trains from and its staleness, for each silo whose
	// last fetched version is not Global (absent silos train from Global
	// with staleness 0).
	Base map[string]Base `cbor:"base,omitempty" json:"base,omitempty"`
	// HE, when set, runs the round in threshold-he mode (package
	// secagg/he) on the Reducer's secure-aggregation host (secagg/wire,
	// its threshold-he scheme) instead of pairwise masking; SecAgg still names the members,
	// dimension, clip, weighting and grid.
	HE *HERound `cbor:"he,omitempty" json:"he,omitempty"`
	// SubCohorts, when set, make the round hierarchical (docs/secagg.md,
	// "Hierarchical secure aggregation"): the cohort is split by the
	// child cluster that leads each silo, each sub-cohort is its own
	// secure-aggregation round hosted by that child, whose Params name
	// the parent's per-round key (Params.Parent), and the Reducer's host
	// adds the children's partial sums. SecAgg then names the whole
	// cohort (its Round is the parent's round, its grid the one every
	// sub-cohort shares); a silo takes part with its sub-cohort's
	// Params (ForSite).
	SubCohorts []SubCohort `cbor:"sub_cohorts,omitempty" json:"sub_cohorts,omitempty"`
}

// SubCohort is one child cluster's part of a hierarchical round.
type SubCohort struct {
	// Cluster is the child cluster (its member name, role cluster, in
	// the parent's federation) that hosts the sub-cohort's round.
	Cluster string        `cbor:"cluster" json:"cluster"`
	SecAgg  secagg.Params `cbor:"secagg" json:"secagg"`
}

// SubCohortOf returns the sub-cohort a hierarchical round gives cluster.
func (b *RoundBundle) SubCohortOf(cluster string) (*SubCohort, bool) {
	for i := range b.SubCohorts {
		if b.SubCohorts[i].Cluster == cluster {
			return &b.SubCohorts[i], true
		}
	}
	return nil, false
}

// ForSite returns the round as site takes part in it: for a hierarchical
// round, with SecAgg its sub-cohort's Params and no Reducer (its round
// is hosted by its child cluster, which the site finds among its own
// cluster's aggregators); any other round as it is. ok is false when a
// hierarchical round lists site in no sub-cohort.
func (b RoundBundle) ForSite(site string) (RoundBundle, bool) {
	if len(b.SubCohorts) == 0 {
		return b, true
	}
	for _, sc := range b.SubCohorts {
		for _, m := range sc.SecAgg.Members {
			if m.ID == site {
				b.SecAgg, b.Reducer = sc.SecAgg, ""
				return b, true
			}
		}
	}
	return b, false
}

// Base is a stale global version a silo trains from in a buffered run.
type Base struct {
	Global    content.Ref `cbor:"global" json:"global"`
	Staleness int         `cbor:"staleness" json:"staleness"`
}

// BaseOf returns the global silo trains from this round and its staleness.
func (b *RoundBundle) BaseOf(silo string) (content.Ref, int) {
	if x, ok := b.Base[silo]; ok {
		return x.Global, x.Staleness
	}
	return b.Global, 0
}

// RoundFormat versions RoundBundle.
const RoundFormat = "scellis/round/v1"

// DefaultMetrics are the summable metrics every built-in strategy reports.
var DefaultMetrics = []string{"correct", "examples", "loss"}

// Summed returns what a round of the run sums besides the update, and on
// which grid: without DP, DefaultMetrics and grid 0 (secure aggregation
// derives the finest grid); under DP, no metrics (they would leave
// unnoised and uncharged; silos refuse a round that asks for them) and
// the grid dp.GridFracBits(clip, dims) that silos add their noise on.
func (s *RunSpec) Summed(dims int) (metrics []string, gridBits int) {
	if !s.DP {
		return DefaultMetrics, 0
	}
	return nil, dp.GridFracBits(s.Clip, dims)
}

// Pack lays an update and its metrics out as the secure-aggregation input.
func (b *RoundBundle) Pack(update []float64, metrics map[string]float64) []float64 {
	out := make([]float64, 0, b.UpdateDim+len(b.Metrics))
	out = append(out, update...)
	for _, m := range b.Metrics {
		out = append(out, metrics[m])
	}
	return out
}

// Unpack splits a secure sum into the summed update and summed metrics.
func (b *RoundBundle) Unpack(sum []float64) (update []float64, metrics map[string]float64) {
	update = sum[:b.UpdateDim]
	metrics = map[string]float64{}
	for i, m := range b.Metrics {
		metrics[m] = sum[b.UpdateDim+i]
	}
	return update, metrics
}

// RoundResult is the reduced document of a round job: what the reducer
// peer stores as a blob and reports (ReportReduced) as the round's model.
// It carries the next global state itself, so the next round is planned
// from this document alone, and only sums: the metrics and the weight are
// those of the secure sum, never one site's.
type RoundResult struct {
	Format   string      `cbor:"format" json:"format"`
	Run      content.Ref `cbor:"run" json:"run"`
	Round    int         `cbor:"round" json:"round"`
	Job      content.Ref `cbor:"job" json:"job"`
	Bundle   content.Ref `cbor:"bundle" json:"bundle"`
	Strategy content.Ref `cbor:"strategy" json:"strategy"`
	// Previous is the model hash the round started from (the bundle's
	// Global); Model the hash of Global, the model the round produced.
	Previous content.Ref `cbor:"previous" json:"previous"`
	Model    content.Ref `cbor:"model" json:"model"`
	Global   []byte      `cbor:"global" json:"global"` // Global.Encode() of the next state
	// Metrics are the summed metrics (DefaultMetrics); Weight the total
	// weight the server step received.
	Metrics map[string]float64 `cbor:"metrics" json:"metrics"`
	Weight  float64            `cbor:"weight" json:"weight"`
	// Participants are the silos whose inputs the sum holds, Dropped the
	// cohort silos it does not hold (sorted). ErrorBound bounds the
	// fixed-point rounding of each summed value.
	Participants []string `cbor:"participants" json:"participants"`
	Dropped      []string `cbor:"dropped" json:"dropped"`
	// Absent are the run's silos left out of the round's cohort because
	// they were not alive (no recent lease poll) when it was planned: a
	// silo that died between rounds is absent, not dropped (sorted).
	Absent     []string `cbor:"absent,omitempty" json:"absent,omitempty"`
	ErrorBound float64  `cbor:"error_bound" json:"error_bound"`
	// SecAggRound is the secure-aggregation round ID the sum came from.
	SecAggRound string `cbor:"secagg_round" json:"secagg_round"`
	// Step is the bundle's step kind (empty: training); Std the run's
	// standardisation after this step (set by the statistics step and
	// carried forward), so the last result holds what the model needs.
	Step string           `cbor:"step,omitempty" json:"step,omitempty"`
	Std  *Standardization `cbor:"std,omitempty" json:"std,omitempty"`
	// Staleness is, in a buffered-asynchronous run, each participant's
	// staleness (server steps since the version it trained from); silos
	// that trained from the current global are absent.
	Staleness map[string]int `cbor:"staleness,omitempty" json:"staleness,omitempty"`
	// Check is how the round's reduction — the unmasking of its sum and
	// its server step — was checked by a second aggregator node
	// (docs/fl.md, "The cross-checked reduction").
	Check *ReductionCheck `cbor:"check,omitempty" json:"check,omitempty"`
}

// How a round's reduction was checked (ReductionCheck.Mode).
const (
	// CrossChecked: a second aggregator node replayed the round's secure
	// sum from its transcript and ran the server step itself; both
	// nodes' digests of the outcome are equal and both are cited.
	CrossChecked = "cross-checked"
	// SelfOnly: the cluster has one aggregator node; no second node
	// could recompute the round, and only its own digest is cited.
	SelfOnly = "self-only"
	// Unchecked: a round whose sum no second node can replay
	// (threshold-he, a hierarchical round); only the leader's digest is
	// cited.
	Unchecked = "unchecked"
)

// ReductionCheck is the cross-check of a round's reduction: the nodes
// that computed the round's outcome (the leader first) and the digest
// each got, signed.
type ReductionCheck struct {
	Mode  string      `cbor:"mode" json:"mode"`
	Note  string      `cbor:"note,omitempty" json:"note,omitempty"` // why not cross-checked
	Nodes []CheckNode `cbor:"nodes" json:"nodes"`
}

// CheckNode is one node's computation of a round's outcome: its digest
// (RoundDigest's hash), signed with the node's identity key over
// CheckStatement.
type CheckNode struct {
	Node   string      `cbor:"node" json:"node"`
	Key    string      `cbor:"key" json:"key"`
	Digest content.Ref `cbor:"digest" json:"digest"`
	Sig    []byte      `cbor:"sig" json:"sig"`
}

// CheckStatement is what a node signs for its digest of a round
// (identity.PurposeRoundCheck).
type CheckStatement struct {
	Format string      `cbor:"format"`
	Run    content.Ref `cbor:"run"`
	Round  int         `cbor:"round"`
	Bundle content.Ref `cbor:"bundle"`
	Node   string      `cbor:"node"`
	Digest content.Ref `cbor:"digest"`
}

// CheckStatementFormat versions CheckStatement.
const CheckStatementFormat = "scellis/round-check/v1"

// RoundDigest is what two nodes compare of a round's outcome, bit for
// bit: the sum the secure aggregation opened (the hash of its float64
// bits), who it holds, and what the round's step made of it — the next
// model, and for the statistics step the standardisation.
type RoundDigest struct {
	Format       string           `cbor:"format"`
	Run          content.Ref      `cbor:"run"`
	Round        int              `cbor:"round"`
	Bundle       content.Ref      `cbor:"bundle"`
	Sum          content.Ref      `cbor:"sum"`
	Weight       float64          `cbor:"weight"`
	ErrorBound   float64          `cbor:"error_bound"`
	Contributors []string         `cbor:"contributors"`
	Dropped      []string         `cbor:"dropped"`
	Model        content.Ref      `cbor:"model"`
	Std          *Standardization `cbor:"std,omitempty"`
}

// RoundDigestFormat versions RoundDigest.
const RoundDigestFormat = "scellis/round-digest/v1"

// RoundResultFormat versions RoundResult.
const RoundResultFormat = "scellis/round-result/v1"

// DecodeRoundResult parses a round result document and the global state it
// carries, checking that the state hashes to Model.
func DecodeRoundResult(b []byte) (*RoundResult, Global, error) {
	var r RoundResult
	if err := content.Decode(b, &r); err != nil {
		return nil, nil, fmt.Errorf("fl: not a round result: %w", err)
	}
	if r.Format != RoundResultFormat {
		return nil, nil, fmt.Errorf("fl: round result format %q, want %q", r.Format, RoundResultFormat)
	}
	if content.Hash(r.Global) != r.Model {
		return nil, nil, fmt.Errorf("fl: the round result's global state does not hash to its model %s", r.Model.Short())
	}
	g, err := DecodeGlobal(r.Global)
	if err != nil {
		return nil, nil, err
	}
	return &r, g, nil
}

// Params returns the strategy params of a run: the spec's params, with
// the model's kind, classes, hidden width and a cnn's image shape and
// convolution channels from the spec's model where the params do not set
// them (the fl-common params model, classes, hidden, image, conv). The aggregator (init, update_dims, server_step) and the silos
// (client_step) both use it, so they agree on the model.
func (c *Canonical) Params() map[string]any {
	p := maps.Clone(c.Spec.Params)
	if p == nil {
		p = map[string]any{}
	}
	set := func(k string, v any, zero bool) {
		if _, ok := p[k]; !ok && !zero {
			p[k] = v
		}
	}
	set("model", c.Spec.Model.Kind, c.Spec.Model.Kind == "")
	set("classes", int64(c.Spec.Model.Classes), c.Spec.Model.Classes == 0)
	set("hidden", int64(c.Spec.Model.Hidden), c.Spec.Model.Hidden == 0)
	ints := func(v []int) []any {
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out
	}
	set("image", ints(c.Spec.Model.Image), len(c.Spec.Model.Image) == 0)
	set("conv", ints(c.Spec.Model.Conv), len(c.Spec.Model.Conv) == 0)
	return p
}
