package fl

import (
	"errors"
	"math"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/internal/yamlpos"
	"github.com/scellis/scellis/trainer"
)

// parseTrainerRun checks what a run with a trainer cannot have: feature
// statistics or a standardisation (the trainer reads its data file as it
// is) and, under DP, a per-record sampling rate (a trainer's update is
// released at the silo level, q = 1), or SCAFFOLD (a trainer returns its
// weights, not control variates: SC9511, also refused by Resolve for a
// strategy given by ref or path). Federated evaluation is the trainer's
// evaluate (TrainerEvalRelease).
func parseTrainerRun(d *yamlpos.Decoder, f map[string]*yaml.Node, s *RunSpec) {
	if builtinSizesItsUpdate(s.Strategy) {
		d.Errorf(strategyUse(f["strategy"]), diag.TrainerStrategy, "strategy", trainerStrategyHelp,
			"strategy %s with a trainer: it sizes its update itself (update_dims), as SCAFFOLD does for its control variates; a trainer returns only its trained weights", s.Strategy)
	}
	if n := f["standardize"]; n != nil && s.Standardize != StandardizeNone {
		d.Errorf(n, diag.InvalidValue, "standardize", "drop standardize (or write none): the trainer reads its data file as it is and normalises it itself",
			"standardize: %s with a trainer", s.Standardize)
	}
	if n := f["privacy"]; n != nil && s.DP && s.Q != 0 && s.Q != 1 {
		d.Errorf(n, diag.InvalidValue, "privacy.q", "drop privacy.q: a trainer's update is released at the silo level (unit: silo), once per round",
			"privacy.q = %g with a trainer; record-level DP-SGD inside a trainer is not trusted", s.Q)
	}
}

const trainerStrategyHelp = "use fedavg or fedprox (FedProx's mu also corrects client drift on non-IID data), or drop trainer: and train a built-in model with scaffold; docs/trainers.md"

// strategyUse is the node naming the run's strategy: the scalar, or the
// mapping's use.
func strategyUse(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "use" {
				return n.Content[i+1]
			}
		}
	}
	return n
}

// builtinSizesItsUpdate reports whether name is a built-in strategy of
// the catalog that sizes its update itself (update_dims): refused with a
// trainer at the spec's line (Resolve refuses any other such strategy,
// by ref or path, without one).
func builtinSizesItsUpdate(name string) bool {
	c, err := catalog.BuiltinLazy()
	if err != nil {
		return false
	}
	e, ok := c.Lookup(name)
	return ok && e.HasFunc("update_dims")
}

// checkTrainerStrategy refuses, for a trainer run, a strategy that sizes
// its update itself (update_dims): its server step expects more than the
// trained weights' change a trainer gives (SCAFFOLD's control variates),
// whatever name or path it is given by.
func (s *RunSpec) checkTrainerStrategy(st *Strategy) error {
	if s.Trainer == "" || !st.Entry.HasFunc("update_dims") {
		return nil
	}
	d := diag.New(diag.TrainerStrategy, "strategy", "strategy %s sizes its update itself (update_dims), as SCAFFOLD does for its control variates; a trainer returns only its trained weights", st.Entry.Name).
		WithHelp("%s", trainerStrategyHelp)
	d.Pos = &diag.Position{File: s.File}
	return d
}

// LoadTrainer loads the run's trainer directory (relative to baseDir, the
// run file's folder) and returns it with its content hash; its initial
// weights must be there (SC9501).
func (s *RunSpec) LoadTrainer(baseDir string) (*trainer.Bundle, content.Ref, error) {
	dir := s.Trainer
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(baseDir, dir)
	}
	b, err := trainer.Load(dir)
	if err != nil {
		return nil, "", err
	}
	if _, _, err := b.Init(); err != nil {
		return nil, "", err
	}
	ref, err := b.Ref()
	return b, ref, err
}

// TrainerGlobal is a trainer run's initial global state: the trainer's
// init.npy as w.
func TrainerGlobal(b *trainer.Bundle) (Global, error) {
	w, _, err := b.Init()
	if err != nil {
		return nil, err
	}
	return Global{"w": w, "round": int64(0)}, nil
}

// TrainerOutput is a trainer's client step: the update its trained weights
// imply (trained − global), released exactly as a built-in model's under
// update-level DP (clipped, on the grid, noised: releaseUpdate) with weight
// 1, or without DP scaled by the examples it trained on, with that weight
// (FedAvg's weighting by rows, as fl-common's client_weight). A trainer's
// own privacy claims play no part: only the silo's release leaves.
// Record-level DP is refused (a trainer's DP-SGD is not trusted).
func TrainerOutput(global, trained []float64, examples int, p Privacy) (ClientOutput, error) {
	if len(trained) != len(global) {
		return ClientOutput{}, diag.New(diag.TrainerOutput, "trainer", "the trainer returned %d weights for a model of %d", len(trained), len(global))
	}
	if examples <= 0 {
		return ClientOutput{}, diag.New(diag.TrainerOutput, "trainer", "the trainer reports training on %d examples", examples).
			WithHelp("the trainer's result.json gives the number of examples it trained on")
	}
	update := make([]float64, len(global))
	for i := range update {
		update[i] = trained[i] - global[i]
	}
	out := ClientOutput{Update: update}
	switch p.Unit {
	case UnitNone:
		for i := range update {
			update[i] *= float64(examples)
		}
		out.Weight = float64(examples)
	case UnitSilo:
		if err := p.Validate(); err != nil {
			return ClientOutput{}, err
		}
		out.Weight = 1
		if err := p.releaseUpdate(&out); err != nil {
			return ClientOutput{}, err
		}
	default:
		return ClientOutput{}, diag.New(diag.TrainerUnit, "trainer", "a trainer's update cannot be released under %s-level DP", p.Unit).
			WithHelp("declare the dataset unit: silo")
	}
	return out, nil
}

// KindTrainer is a model file's kind for a trainer run's model.
const KindTrainer = "trainer"

// trainerModelFile is a trainer run's model file: the final weights and
// the trainer's content hash (the trainer gives them their meaning).
func trainerModelFile(spec *Canonical, global Global) (*ModelFile, error) {
	w, ok := global.Vector("w")
	if !ok {
		return nil, errors.New("fl: the final global state has no parameter vector w")
	}
	return &ModelFile{Format: ModelFileFormat, Kind: KindTrainer, Trainer: spec.Trainer, Params: slices.Clone(w),
		Global: global, Classes: []float64{}, Features: []string{}, Standardization: Standardization{Mode: StandardizeNone}}, nil
}

// TrainerEvalRelease is a silo's part of an evaluation step of a trainer
// run: the sums its trainer's evaluate reported on the held-out rows
// (metrics "correct" and "loss", over examples rows), as what the step
// secure-aggregates in EvalMetrics order.
//
// Without DP they are the sums themselves, as a built-in model's
// (EvalSums). Under DP the silo cannot bound one row's influence on what
// a trainer reports (its evaluate is code the silo runs, not code it
// trusts to score row by row), so the whole silo is the unit, as for its
// update: its metrics are one record (accuracy in [0, 1], 1, mean loss
// capped at EvalLossCap), released by ReleaseRecordSums at the built-in
// evaluation's sensitivity and grid, charged as the same Gaussian step.
// The step's sums then average over silos, not rows: eval_examples counts
// the silos (noised), eval_correct their accuracies.
//
// A report the trainer could not have made (a negative or fractional
// count, more correct than examples, a negative loss) is SC9507.
func TrainerEvalRelease(metrics map[string]float64, examples int, p Privacy, gridBits int) ([]float64, []int64, []dp.Mechanism, error) {
	n := float64(examples)
	if v, ok := metrics["examples"]; ok {
		n = v
	}
	correct, loss := metrics["correct"], metrics["loss"]
	bad := func(format string, args ...any) error {
		return diag.New(diag.TrainerOutput, "trainer evaluate", format, args...).
			WithHelp(`evaluate returns sums over the rows it scored: {"examples": n, "correct": c, "loss": total}, with 0 ≤ c ≤ n and a loss ≥ 0`)
	}
	switch {
	case n < 0 || n != math.Trunc(n) || n > 1<<53:
		return nil, nil, nil, bad("evaluate reports %v examples", n)
	case correct < 0 || correct > n || correct != math.Trunc(correct):
		return nil, nil, nil, bad("evaluate reports %v correct of %v examples", correct, n)
	case loss < 0:
		return nil, nil, nil, bad("evaluate reports a loss of %v", loss)
	}
	if p.Unit == UnitNone {
		return []float64{correct, n, loss}, nil, nil, nil
	}
	if n == 0 {
		return nil, nil, nil, bad("evaluate scored no rows; under DP the silo releases its accuracy, which needs at least one")
	}
	record := []float64{correct / n, 1, min(loss/n, EvalLossCap)}
	enc, mechs, err := p.ReleaseRecordSums(func(yield func([]float64) bool) { yield(record) }, len(EvalMetrics), EvalSensitivity(), gridBits)
	return nil, enc, mechs, err
}
