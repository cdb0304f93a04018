package fl

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

// A run is a list of steps; each is one round job of the coordinator
// (law 1: one mechanism). Before the training rounds comes the
// feature-statistics step when the run standardises with federated
// statistics; after them, the final evaluation step when the run
// evaluates on held-out rows, and with evaluation.every k an evaluation
// step after every k training rounds too. The coordinator's round r is
// step r.
const (
	// StepStats: each silo secure-aggregates per-feature Σx, Σx² and its
	// row count; the reducer turns the sums into the global standardiser.
	StepStats = "stats"
	// StepTrain: a training round (the strategy's client and server step).
	StepTrain = "train"
	// StepEval: each silo evaluates the current model on its held-out
	// rows (after the last training round, and every Eval.Every rounds).
	StepEval = "eval"
)

// EvalMetrics are the held-out metrics silos add to a round's sums: the
// incoming global model evaluated on rows it never trains on.
var EvalMetrics = []string{"eval_correct", "eval_examples", "eval_loss"}

// StatsMetrics are the summed values besides Σx, Σx² of a statistics step.
var StatsMetrics = []string{"rows"}

// StepCount returns the number of coordinator rounds the run takes.
func (s *RunSpec) StepCount() int {
	n := s.Rounds + s.MidEvals()
	if s.StandardizeMode() == StandardizeFederated {
		n++
	}
	if s.Eval.On() {
		n++
	}
	return n
}

// MidEvals is the number of evaluation steps between training rounds:
// one after every Eval.Every of them, except after the last, which the
// final evaluation step scores.
func (s *RunSpec) MidEvals() int {
	if s.Eval.Every <= 0 || !s.Eval.On() || s.Rounds < 1 {
		return 0
	}
	return (s.Rounds - 1) / s.Eval.Every
}

// Step returns the kind of coordinator round r and its training round
// number: for a training round its own (0-based, as strategies see it in
// params.round), for an evaluation step the training rounds done before
// it. With evaluation.every k the training rounds come in blocks of k,
// each but the last followed by an evaluation step.
func (s *RunSpec) Step(r int) (kind string, train int) {
	if s.StandardizeMode() == StandardizeFederated {
		if r == 0 {
			return StepStats, 0
		}
		r--
	}
	if k := s.Eval.Every; k > 0 && s.Eval.On() {
		b, i := r/(k+1), r%(k+1)
		if i == k && (b+1)*k < s.Rounds {
			return StepEval, (b + 1) * k
		}
		r = b*k + i
	}
	if r >= s.Rounds {
		return StepEval, s.Rounds
	}
	return StepTrain, r
}

// TrainStep is the coordinator round of training round t (Step's
// inverse for training rounds).
func (s *RunSpec) TrainStep(t int) int {
	r := t
	if s.StandardizeMode() == StandardizeFederated {
		r++
	}
	if k := s.Eval.Every; k > 0 && s.Eval.On() {
		r += t / k
	}
	return r
}

// ModelSpec is the model the run trains, as the model package builds it:
// the strategy params' model, classes, hidden, image and conv
// (Canonical.Params, which defaults them from the spec), with fl-common's
// default hidden width.
func (c *Canonical) ModelSpec() model.Spec {
	return paramsModelSpec(c.Params(), c.Spec.Model.Inputs)
}

// paramsModelSpec is the model strategy params p describe over inputs
// features: fl-common's model, classes, hidden (16 for an mlp when unset),
// image and conv.
func paramsModelSpec(p map[string]any, inputs int) model.Spec {
	ms := model.Spec{Kind: model.KindLogistic, Inputs: inputs}
	if k, ok := p["model"].(string); ok {
		ms.Kind = k
	}
	if v, ok := asNumber(p["classes"]); ok {
		ms.Classes = int(v)
	}
	if v, ok := asNumber(p["hidden"]); ok {
		ms.Hidden = int(v)
	} else if ms.Kind == model.KindMLP {
		ms.Hidden = 16
	}
	ints := func(v any) []int {
		l, _ := v.([]any)
		var out []int
		for _, x := range l {
			n, _ := asNumber(x)
			out = append(out, int(n))
		}
		return out
	}
	if img := ints(p["image"]); len(img) == 3 {
		ms.Image = [3]int(img)
	} else if len(img) == 2 {
		ms.Image = [3]int{img[0], img[1], 1}
	}
	ms.Conv = ints(p["conv"])
	return ms
}

// NumParams is the number of parameters of the run's model: the trainer's
// weights for a trainer run, else the built-in model's (0 when its spec
// does not fix them).
func (c *Canonical) NumParams() int {
	if c.Trainer != "" {
		return c.TrainerParams
	}
	return c.ModelSpec().NumParams()
}

// EvalLossCap caps one held-out row's loss (nats, or ½(ŷ−y)² for
// regression) under DP, so one row moves the released metric sums
// (correct, examples, loss) by at most (1, 1, EvalLossCap): log-loss is
// otherwise unbounded. 3 nats is a true-class probability of 5%: the cap
// bites only on rows the model gets badly wrong, and keeps the noise on
// the counts, which share the sensitivity √(2+cap²), small.
const EvalLossCap = 3

// EvalSensitivity is the L2 sensitivity of one held-out row's metric
// vector under DP: √(1 + 1 + EvalLossCap²).
func EvalSensitivity() float64 { return math.Sqrt(2 + EvalLossCap*EvalLossCap) }

// StepSums returns what a step of the run secure-aggregates: the length of
// the summed vector before the named values (the update, or Σx and Σx² of
// a statistics step), the names of the summed values after it, and the
// grid the silos encode on (0: secure aggregation derives the finest).
//
// Without DP a training round also sums the training metrics and, when
// the run evaluates, the held-out metrics. Under DP a training round sums
// the update alone (RunSpec.Summed; the metrics would leave unnoised), and
// the statistics and evaluation steps are each one Gaussian release of
// per-row sums on the grid GridFracBits picks for their sensitivity.
func (s *RunSpec) StepSums(ctx context.Context, env script.Env, strat *Strategy, global Global, step string) (dims int, names []string, gridBits int, err error) {
	switch step {
	case StepStats:
		d := s.Model.Inputs
		if s.DP {
			gridBits = dp.GridFracBits(StatsSensitivity(d, s.PublicRows), StatsDim(d, s.PublicRows))
		}
		return 2 * d, StatsMetrics, gridBits, nil
	case StepEval:
		if s.DP {
			gridBits = dp.GridFracBits(EvalSensitivity(), len(EvalMetrics))
		}
		return 0, EvalMetrics, gridBits, nil
	}
	if dims, err = UpdateDims(ctx, env, strat, global); err != nil {
		return 0, nil, 0, err
	}
	names, gridBits = s.Summed(dims)
	if !s.DP && s.Eval.On() && s.Trainer == "" {
		// (A trainer run scores its model in the evaluation steps only:
		// each training round would start the trainer twice.)
		names = append(slices.Clone(names), EvalMetrics...)
	}
	return dims, names, gridBits, nil
}

// RoundCohort returns the silos of coordinator round r of the run, drawn
// from the alive members (sorted), and the local work of its stragglers:
// a training round samples round(Sample·n) of them (at least max(3,
// MinCohort), at most n), and round(Stragglers·k) of those get params
// work uniform in (0, 1) — under DP never so many that fewer than max(3,
// MinCohort) do all their work: a strategy may drop a straggler (FedAvg
// does), and under DP a dropped site takes no part in the round at all
// (it cannot send a zero weight), so more stragglers would leave a round
// below the secure-aggregation minimum on every attempt (the draw is the
// same each time). Statistics and evaluation steps take every member, at
// full work. The draws are a pure function of the run and the round, so a
// re-planned round picks the same silos.
func (s *RunSpec) RoundCohort(run content.Ref, r int, step string, members []string) (cohort []string, work map[string]float64) {
	return s.RoundCohortOf(run, r, step, [][]string{members})
}

// RoundCohortOf is RoundCohort over members in groups that are sampled
// apart: a tree's silos by the child cluster that leads them, each child
// summing its own sub-cohort of at least max(3, MinCohort) sites, which
// a draw over the whole cohort need not leave it. One group is exactly
// RoundCohort's draw (fl simulate's); each further group draws with its
// index in the key.
func (s *RunSpec) RoundCohortOf(run content.Ref, r int, step string, groups [][]string) (cohort []string, work map[string]float64) {
	if step != StepTrain || (s.Sample == 0 && s.Stragglers == 0 && s.Buffer == 0) {
		for _, g := range groups {
			cohort = append(cohort, g...)
		}
		slices.Sort(cohort)
		return cohort, nil
	}
	for i, g := range groups {
		c, w := s.drawCohort(run, r, i, g)
		cohort = append(cohort, c...)
		for name, f := range w {
			if work == nil {
				work = map[string]float64{}
			}
			work[name] = f
		}
	}
	slices.Sort(cohort)
	return cohort, work
}

// drawCohort samples one group of a training round (RoundCohortOf).
func (s *RunSpec) drawCohort(run content.Ref, r, group int, members []string) (cohort []string, work map[string]float64) {
	label := fmt.Appendf(nil, "scellis/fl/round-cohort\x00%s\x00%d", run, r)
	if group > 0 {
		label = fmt.Appendf(label, "\x00group %d", group)
	}
	key := sha256.Sum256(label)
	rng := rand.New(rand.NewChaCha8(key))
	shuffled := func(in []string) []string {
		out := slices.Clone(in)
		for i := len(out) - 1; i > 0; i-- { // Fisher–Yates on Uint64N, stable across Go releases
			j := int(rng.Uint64N(uint64(i + 1)))
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	need := max(s.MinCohort, 3)
	n := len(members)
	k := n
	if s.Sample > 0 {
		k = min(n, max(int(math.Round(s.Sample*float64(n))), need))
	}
	if s.Buffer > 0 {
		k = min(n, max(s.Buffer, need))
	}
	cohort = shuffled(members)[:k]
	slices.Sort(cohort)
	m := int(math.Round(s.Stragglers * float64(k)))
	if s.DP {
		m = min(m, max(0, k-need))
	}
	if m > 0 {
		work = map[string]float64{}
		for _, name := range shuffled(cohort)[:m] {
			work[name] = (float64(rng.Uint64()>>11) + 0.5) * 0x1p-53 // uniform in (0, 1)
		}
	}
	return cohort, work
}
