package account

import (
	"context"
	"errors"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/receipt"
)

// ErrNoModel: the run has no completed step, so no model to export.
var ErrNoModel = errors.New("the run has no completed step yet")

// ModelFile assembles a run's model file (docs/models.md) from its
// account: the last step's model and standardiser, every step's summary,
// each silo's charges, and the refs it was built from — the receipts of
// the run's round jobs among receipts. An aggregator node builds it from
// its own replica and signs it (GET /v1/runs/{id}/model).
func (r *Reader) ModelFile(ctx context.Context, st coordinator.RunStatus, receipts []receipt.Receipt) (*fl.ModelFile, error) {
	if len(st.Models) == 0 {
		return nil, ErrNoModel
	}
	spec, err := r.Spec(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	a, err := r.Run(ctx, st)
	if err != nil {
		return nil, err
	}
	if len(a.Steps) == 0 {
		return nil, ErrNoModel
	}
	lastStep := a.Steps[len(a.Steps)-1]
	last := lastStep.Result
	global, err := lastStep.Global()
	if err != nil {
		return nil, err
	}
	f, err := fl.NewModelFile(spec, global, last.Std)
	if err != nil {
		return nil, err
	}
	if f.Label == "" {
		// The spec names no label: the one its silos' records name.
		f.Label = a.Label()
	}
	f.Run = fl.ModelRun{ID: st.ID, Name: st.Name, State: string(st.State), Spec: spec}
	f.Rounds = make([]fl.RoundSummary, len(a.Steps))
	for i, s := range a.Steps {
		f.Rounds[i] = s.Summary
	}
	f.Privacy = siloCharges(a.Datasets)
	f.Refs = fl.ModelRefs{Run: st.ID, Strategy: last.Strategy, Model: last.Model, RoundResults: st.Models, RoundJobs: st.Jobs, Receipts: []content.Ref{}}
	jobs := map[content.Ref]bool{}
	for _, j := range st.Jobs {
		jobs[j] = true
	}
	for _, rc := range receipts {
		if jobs[rc.Job] {
			f.Refs.Receipts = append(f.Refs.Receipts, rc.Hash)
		}
	}
	return f, nil
}

// siloCharges sums each silo's charges for the model file: rounds charged
// and their ε summed (an upper bound of what RDP composes).
func siloCharges(ds []Dataset) []fl.SiloCharges {
	out := []fl.SiloCharges{}
	for _, d := range ds {
		if n := len(out); n == 0 || out[n-1].Silo != d.Silo {
			out = append(out, fl.SiloCharges{Silo: d.Silo})
		}
		sc := &out[len(out)-1]
		sc.Rounds += d.Rounds
		for _, e := range d.PerRound {
			sc.EpsilonSum += e
		}
	}
	return out
}
