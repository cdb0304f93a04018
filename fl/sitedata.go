package fl

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// SiteData returns one site's rows for one step of a run, as the silo (and
// fl simulate, which must train on exactly the same rows) prepares them:
// the columns in the run's feature order, split into training and held-out
// rows, both standardised as the run says — federated: with std, the
// statistics step's result (raw during the statistics step itself); local:
// with the training rows' own; none: raw. held is nil when the run does
// not evaluate. raw is the site's dataset, evalRaw its evaluation dataset
// when the run names one. The held-out split is a pure function of the
// run and the site's name, so every round holds out the same rows.
func SiteData(spec *Canonical, run content.Ref, site string, raw, evalRaw *model.Dataset, step string, std *Standardization) (train, held *model.Dataset, err error) {
	subject := fmt.Sprintf("run %s dataset %s", run.Short(), spec.Spec.Dataset)
	if train, err = SelectFeatures(raw, spec.Spec.Model.Features, subject); err != nil {
		return nil, nil, err
	}
	switch ev := spec.Spec.Eval; {
	case ev.Dataset != "":
		if evalRaw == nil {
			return nil, nil, diag.New(diag.SiloUnknownDataset, subject, "this site has no evaluation dataset %q", ev.Dataset).
				WithHelp("declare it (its own budget pays for the held-out metrics), or leave the run")
		}
		if held, err = SelectFeatures(evalRaw, spec.Spec.Model.Features, subject); err != nil {
			return nil, nil, err
		}
	case ev.Holdout > 0:
		if train, held, err = HoldOut(run, site, train, ev.Holdout); err != nil {
			return nil, nil, err
		}
	}
	if d := train.Dims(); d != spec.Spec.Model.Inputs {
		return nil, nil, diag.New(diag.FLDimension, subject, "the dataset has %d feature columns; the run's model takes %d", d, spec.Spec.Model.Inputs).
			WithHelp("the run's model.inputs (and model.features) must describe this dataset's columns")
	}
	var s *model.Standardizer
	switch mode := spec.Spec.StandardizeMode(); {
	case mode == StandardizeLocal && train.Rows() > 0:
		f := model.FitStandardizer(train)
		s = &f
	case mode == StandardizeFederated && step != StepStats:
		if s = std.Standardizer(); s == nil {
			return nil, nil, diag.New(diag.RunBadRound, subject, "the round carries no federated feature statistics").
				WithHelp("the run standardises with federated statistics; its statistics step must come first")
		}
		if len(s.Mean) != train.Dims() {
			return nil, nil, diag.New(diag.FLDimension, subject, "the round's statistics cover %d features; the dataset has %d", len(s.Mean), train.Dims())
		}
	}
	if s != nil {
		train = standardize(s, train)
		if held != nil {
			held = standardize(s, held)
		}
	}
	return train, held, nil
}

// HoldOut splits a site's rows into its training and held-out rows for a
// run that evaluates on a held-out fraction frac of them: a pure function
// of the run and the site's name, so every round (and fl simulate) holds
// out the same rows.
func HoldOut(run content.Ref, site string, d *model.Dataset, frac float64) (train, held *model.Dataset, err error) {
	h := sha256.Sum256(fmt.Appendf(nil, "scellis/silo/holdout\x00%s\x00%s", run, site))
	return model.Split(d, frac, binary.BigEndian.Uint64(h[:8]))
}

func standardize(s *model.Standardizer, d *model.Dataset) *model.Dataset {
	if d.Rows() == 0 {
		return d
	}
	out := s.Apply(d)
	out.Name = d.Name
	return out
}

// SelectFeatures returns d with the named columns in that order (all of
// them, in file order, when names is empty); a missing column is refused
// with the full list of what is missing (SC9403).
func SelectFeatures(d *model.Dataset, names []string, subject string) (*model.Dataset, error) {
	if len(names) == 0 {
		return d, nil
	}
	idx := make([]int, len(names))
	var missing []string
	for i, n := range names {
		if idx[i] = slices.Index(d.Features, n); idx[i] < 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, diag.New(diag.ModelColumnsMissing, subject, "the dataset has no column %s for the run's features", strings.Join(missing, ", ")).
			WithHelp("the run's model.features name the columns every site must hold; this dataset has: %s", strings.Join(d.Features, ", "))
	}
	return pick(d, names, idx), nil
}

// pick returns d's columns idx (named names), in that order.
func pick(d *model.Dataset, names []string, idx []int) *model.Dataset {
	out := &model.Dataset{Name: d.Name, Features: slices.Clone(names), Label: d.Label, Y: d.Y}
	data := make([]float64, 0, d.Rows()*len(idx))
	for i := range d.Rows() {
		row := d.Row(i)
		for _, j := range idx {
			data = append(data, row[j])
		}
	}
	out.X = matrixOf(d.Rows(), len(idx), data)
	return out
}

// ClientSeed is the seed of one site's client step in coordinator round
// round of run: its 32 bytes key the step's script rng (script.Env.Seed)
// and ClientParamSeed of it is the strategy's params.seed. The silo and fl
// simulate derive it the same way, so a simulation of the same sites
// trains exactly as the live run does.
func ClientSeed(run content.Ref, round int, roundSeed int64, site string) [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "scellis/silo/client-step\x00%s\x00%d\x00%d\x00%s", run, round, roundSeed, site))
}

// ClientParamSeed is the params.seed a client step gets from its seed (63
// bits, non-negative).
func ClientParamSeed(seed [32]byte) int64 {
	return int64(binary.BigEndian.Uint64(seed[:8]) >> 1)
}
