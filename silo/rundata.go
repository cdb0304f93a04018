package silo

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
)

// runData returns the silo's rows for one step of a run: the columns in the
// run's feature order, split into training and held-out rows, both
// standardised as the run says (federated: with the bundle's global
// statistics, none yet during the statistics step; local: with the
// training rows' own; none: raw). The split is a pure function of the run
// and the silo, so every round holds out the same rows.
func (a *Appliance) runData(run content.Ref, spec *fl.Canonical, b *fl.RoundBundle) (train, held *model.Dataset, err error) {
	subject := fmt.Sprintf("run %s dataset %s", run.Short(), spec.Spec.Dataset)
	raw, ok := a.Data[spec.Spec.Dataset]
	if !ok {
		return nil, nil, diag.New(diag.SiloUnknownDataset, subject, "this silo declares no dataset %q", spec.Spec.Dataset).
			WithHelp("declare the dataset in the silo config, or leave the run")
	}
	if train, err = selectFeatures(raw, spec.Spec.Model.Features, subject); err != nil {
		return nil, nil, err
	}
	switch ev := spec.Spec.Eval; {
	case ev.Dataset != "":
		e, ok := a.Data[ev.Dataset]
		if !ok {
			return nil, nil, diag.New(diag.SiloUnknownDataset, subject, "this silo declares no evaluation dataset %q", ev.Dataset).
				WithHelp("declare it in the silo config (its own budget pays for the held-out metrics), or leave the run")
		}
		if held, err = selectFeatures(e, spec.Spec.Model.Features, subject); err != nil {
			return nil, nil, err
		}
	case ev.Holdout > 0:
		h := sha256.Sum256(fmt.Appendf(nil, "scellis/silo/holdout\x00%s\x00%s", run, a.Name))
		if train, held, err = model.Split(train, ev.Holdout, binary.BigEndian.Uint64(h[:8])); err != nil {
			return nil, nil, err
		}
	}
	if d := train.Dims(); d != spec.Spec.Model.Inputs {
		return nil, nil, diag.New(diag.FLDimension, subject, "the dataset has %d feature columns; the run's model takes %d", d, spec.Spec.Model.Inputs).
			WithHelp("the run's model.inputs (and model.features) must describe this dataset's columns")
	}
	var std *model.Standardizer
	switch mode := spec.Spec.StandardizeMode(); {
	case mode == fl.StandardizeLocal && train.Rows() > 0:
		s := model.FitStandardizer(train)
		std = &s
	case mode == fl.StandardizeFederated && b.Step != fl.StepStats:
		if std = b.Std.Standardizer(); std == nil {
			return nil, nil, diag.New(diag.RunBadRound, subject, "the round carries no federated feature statistics").
				WithHelp("the run standardises with federated statistics; its statistics step must come first")
		}
		if len(std.Mean) != train.Dims() {
			return nil, nil, diag.New(diag.FLDimension, subject, "the round's statistics cover %d features; the dataset has %d", len(std.Mean), train.Dims())
		}
	}
	if std != nil {
		train = standardize(std, train)
		if held != nil {
			held = standardize(std, held)
		}
	}
	return train, held, nil
}

func standardize(s *model.Standardizer, d *model.Dataset) *model.Dataset {
	if d.Rows() == 0 {
		return d
	}
	out := s.Apply(d)
	out.Name = d.Name
	return out
}

// selectFeatures returns d with the named columns in that order (all of
// them, in file order, when names is empty); a missing column is refused
// with the full list of what is missing.
func selectFeatures(d *model.Dataset, names []string, subject string) (*model.Dataset, error) {
	if len(names) == 0 {
		return d, nil
	}
	idx := make([]int, len(names))
	var missing []string
	for i, n := range names {
		idx[i] = -1
		for j, f := range d.Features {
			if f == n {
				idx[i] = j
			}
		}
		if idx[i] < 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, diag.New(diag.ModelColumnsMissing, subject, "the dataset has no column %s for the run's features", strings.Join(missing, ", ")).
			WithHelp("the run's model.features name the columns every silo must hold; this dataset has: %s", strings.Join(d.Features, ", "))
	}
	out := &model.Dataset{Name: d.Name, Features: append([]string(nil), names...), Label: d.Label, Y: d.Y}
	if d.Rows() == 0 {
		return out, nil
	}
	data := make([]float64, 0, d.Rows()*len(names))
	for i := range d.Rows() {
		row := d.Row(i)
		for _, j := range idx {
			data = append(data, row[j])
		}
	}
	out.X = mat.NewDense(d.Rows(), len(names), data)
	return out, nil
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
