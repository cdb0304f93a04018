package silo

import (
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
)

// runData returns the silo's rows for one step of a run (fl.SiteData:
// the run's feature order, the held-out split, the run's standardisation);
// none for a trainer run.
func (a *Appliance) runData(run content.Ref, spec *fl.Canonical, b *fl.RoundBundle) (train, held *model.Dataset, err error) {
	if spec.Trainer != "" {
		return nil, nil, nil // the trainer reads the dataset's file itself (trainer.go)
	}
	raw, ok := a.Data[spec.Spec.Dataset]
	if !ok {
		return nil, nil, diag.New(diag.SiloUnknownDataset, fmt.Sprintf("run %s dataset %s", run.Short(), spec.Spec.Dataset), "this silo declares no dataset %q", spec.Spec.Dataset).
			WithHelp("declare the dataset in the silo config, or leave the run")
	}
	var evalRaw *model.Dataset
	if n := spec.Spec.Eval.Dataset; n != "" {
		evalRaw = a.Data[n]
	}
	return fl.SiteData(spec, run, a.Name, raw, evalRaw, b.Step, b.Std)
}

// weights returns the global state's parameter vector w (nil without one).
func weights(g fl.Global) []float64 {
	w, _ := g.Vector("w")
	return w
}

// heldOut evaluates the global model's parameters w on the held-out rows
// and returns what to release: the metric sums as values (DP off), or,
// under DP, their per-row release on the grid of 2^gridBits with the
// mechanism to charge (fl.Privacy.ReleaseRecordSums).
func heldOut(spec *fl.Canonical, global fl.Global, held *model.Dataset, p fl.Privacy, gridBits int) ([]float64, []int64, []dp.Mechanism, error) {
	w, ok := global.Vector("w")
	if !ok {
		return nil, nil, nil, diag.New(diag.FLContract, "evaluation", "the global state has no parameter vector w to evaluate").
			WithHelp("federated evaluation scores the global state's w; the strategy must keep its parameters there")
	}
	if held == nil {
		return nil, nil, nil, diag.New(diag.RunBadRound, "evaluation", "the run declares no held-out rows to evaluate on")
	}
	if p.Unit == fl.UnitNone {
		m, err := fl.EvalSums(spec.ModelSpec(), w, held)
		if err != nil {
			return nil, nil, nil, err
		}
		vals := make([]float64, len(fl.EvalMetrics))
		for i, k := range fl.EvalMetrics {
			vals[i] = m[k]
		}
		return vals, nil, nil, nil
	}
	rows, err := fl.EvalRecords(spec.ModelSpec(), w, held)
	if err != nil {
		return nil, nil, nil, err
	}
	enc, mechs, err := p.ReleaseRecordSums(rows, len(fl.EvalMetrics), fl.EvalSensitivity(), gridBits)
	return nil, enc, mechs, err
}
