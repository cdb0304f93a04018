package silo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/trainer"
)

// checkTrainer refuses a trainer round the policy does not allow: a
// trainer not listed by its content hash (SC9502), or record-level DP
// (SC9510: a trainer's own DP-SGD is not trusted; its update is released
// at the silo level).
func (p Policy) checkTrainer(req RoundRequest) diag.List {
	var out diag.List
	if _, ok := p.trainer(req.Trainer); !ok {
		allowed := make([]string, len(p.Trainers))
		for i, t := range p.Trainers {
			allowed[i] = t.Name + " " + content.Ref(t.Hash).Short()
		}
		list := "none"
		if len(allowed) > 0 {
			list = strings.Join(allowed, ", ")
		}
		out = append(out, diag.New(diag.TrainerNotAllowed, req.Subject(), "the run's trainer %s is not allowed by this silo's policy (it allows %s)", req.Trainer, list).
			WithHelp("the silo's operator reviews the trainer (scellis trainer check DIR prints its hash) and lists it under policy.trainers"))
	}
	if req.Privacy.Unit == fl.UnitRecord {
		out = append(out, diag.New(diag.TrainerUnit, req.Subject(), "the run's trainer would train dataset %q under record-level DP; a trainer's own DP-SGD is not trusted", req.Dataset).
			WithHelp("declare the dataset unit: silo (its update is clipped and noised by the silo), or leave the run"))
	}
	return out
}

// trainer returns the policy's entry for the trainer with content hash ref.
func (p Policy) trainer(ref content.Ref) (config.Trainer, bool) {
	for _, t := range p.Trainers {
		if content.Ref(t.Hash) == ref {
			return t, true
		}
	}
	return config.Trainer{}, false
}

// trainerJob readies a run of the run's trainer from the global model:
// the policy's entry for it (checked again where it runs), its bundle
// fetched and checked against its content hash, and a job holding the
// global weights in its layout under the policy's interpreter and limits.
func (a *Appliance) trainerJob(ctx context.Context, spec *fl.Canonical, global fl.Global, subject string) (config.Trainer, trainer.Job, error) {
	allowed, ok := a.Policy.trainer(spec.Trainer)
	if !ok { // CheckRound refused it already; checked again where it runs
		return allowed, trainer.Job{}, a.Policy.checkTrainer(RoundRequest{Run: subject, Trainer: spec.Trainer})
	}
	raw, err := a.runBlob(ctx, spec.Trainer)
	if err != nil {
		return allowed, trainer.Job{}, fmt.Errorf("fetching trainer %s: %w", spec.Trainer.Short(), err)
	}
	if content.Hash(raw) != spec.Trainer {
		return allowed, trainer.Job{}, diag.New(diag.TrainerBad, subject, "the trainer blob does not hash to %s", spec.Trainer.Short()).
			WithHelp("the pool served other bytes; the silo runs only the content its policy allows")
	}
	b, err := trainer.Decode(raw)
	if err != nil {
		return allowed, trainer.Job{}, err
	}
	_, layout, err := b.Init()
	if err != nil {
		return allowed, trainer.Job{}, err
	}
	if layout.Size() != spec.TrainerParams {
		// The policy admitted the round on the run's figure
		// (max_model_params): the trainer must be that size.
		return allowed, trainer.Job{}, diag.New(diag.FLDimension, subject, "the trainer's layout has %d weights; its run says %d", layout.Size(), spec.TrainerParams).
			WithHelp("the run's trainer_params is its trainer's init.npy size; the run spec was not made by scellis fl launch")
	}
	w, ok := global.Vector("w")
	if !ok || len(w) != layout.Size() {
		return allowed, trainer.Job{}, diag.New(diag.FLDimension, subject, "the global model has %d weights; the trainer's layout has %d", len(w), layout.Size()).
			WithHelp("the run's model is the trainer's init.npy; the round does not fit its run")
	}
	return allowed, trainer.Job{
		Interpreter: allowed.Interpreter, Bundle: b, Weights: w, Layout: layout,
		Dir:    a.trainerJobsDir(),
		Limits: trainer.Limits{CPUSeconds: allowed.CPUSeconds, MemoryMB: allowed.MemoryMB, Wall: allowed.Wall},
	}, nil
}

func (a *Appliance) trainerJobsDir() string { return filepath.Join(a.Config.DataDir, "trainer-jobs") }

// trainerFiles are the files a step of a trainer run reads: the training
// rows and, when the run evaluates, the held-out rows, each a file on the
// silo's disk with its label column; remove deletes what was written for
// the step.
type trainerFiles struct {
	train, trainLabel string
	held, heldLabel   string
	remove            func()
}

// trainerFiles returns the files of the run's dataset a trainer reads: the
// dataset's own file; with evaluation.dataset, that dataset's file as the
// held-out rows; with evaluation.holdout, the dataset split as a built-in
// model's is (fl.HoldOut: the same rows every round), each part written
// as a CSV of its own (header, features, label) for the step, so the
// trainer never trains on the rows it is scored on.
func (a *Appliance) trainerFiles(run content.Ref, spec *fl.Canonical, subject string) (trainerFiles, error) {
	f := trainerFiles{remove: func() {}}
	ds, ok := a.Config.Dataset(spec.Spec.Dataset)
	if !ok {
		return f, diag.New(diag.SiloUnknownDataset, subject, "this silo declares no dataset %q", spec.Spec.Dataset)
	}
	f.train, f.trainLabel = ds.Path, ds.Label
	switch ev := spec.Spec.Eval; {
	case ev.Dataset != "":
		e, ok := a.Config.Dataset(ev.Dataset)
		if !ok {
			return f, diag.New(diag.SiloUnknownDataset, subject, "this site has no evaluation dataset %q", ev.Dataset).
				WithHelp("declare it (its own budget pays for the held-out metrics), or leave the run")
		}
		f.held, f.heldLabel = e.Path, e.Label
	case ev.Holdout > 0:
		raw, ok := a.Data[spec.Spec.Dataset]
		if !ok {
			return f, diag.New(diag.SiloUnknownDataset, subject, "this silo declares no dataset %q", spec.Spec.Dataset)
		}
		train, held, err := fl.HoldOut(run, a.Name, raw, ev.Holdout)
		if err != nil {
			return f, err
		}
		if err := os.MkdirAll(a.trainerJobsDir(), 0o700); err != nil {
			return f, err
		}
		dir, err := os.MkdirTemp(a.trainerJobsDir(), "split-")
		if err != nil {
			return f, err
		}
		f.remove = func() { os.RemoveAll(dir) }
		f.train, f.held = filepath.Join(dir, "train.csv"), filepath.Join(dir, "held-out.csv")
		f.trainLabel, f.heldLabel = raw.Label, raw.Label
		for _, part := range []struct {
			path string
			d    *model.Dataset
		}{{f.train, train}, {f.held, held}} {
			if err := writeCSVFile(part.path, part.d); err != nil {
				f.remove()
				return f, fmt.Errorf("writing the trainer's %s: %w", filepath.Base(part.path), err)
			}
		}
	}
	return f, nil
}

// writeCSVFile writes d to path as CSV, readable by the silo only.
func writeCSVFile(path string, d *model.Dataset) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := model.WriteCSV(out, d); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// trainWithTrainer is a trainer run's client step: the run's trainer, in
// its sandbox under the policy's interpreter and limits, trains from the
// global model on the dataset's training rows, and the update it implies
// (trained weights − global) is released as a built-in model's is
// (fl.TrainerOutput: clipped, on the grid and noised under DP). Whatever
// the trainer does, its failure is a diagnostic (SC95xx): the silo
// declines and charges nothing.
func (a *Appliance) trainWithTrainer(ctx context.Context, run content.Ref, spec *fl.Canonical, global fl.Global, strategy *fl.Strategy, p fl.Privacy, subject string) (fl.ClientOutput, error) {
	allowed, j, err := a.trainerJob(ctx, spec, global, subject)
	if err != nil {
		return fl.ClientOutput{}, err
	}
	files, err := a.trainerFiles(run, spec, subject)
	if err != nil {
		return fl.ClientOutput{}, err
	}
	defer files.remove()
	j.Mode, j.Data, j.Label, j.Params = trainer.ModeTrain, files.train, files.trainLabel, strategy.Params
	res, err := trainer.Run(ctx, j)
	if err != nil {
		return fl.ClientOutput{}, err
	}
	a.logf("%s: trainer %s (%s) trained on %d examples in %v", subject, allowed.Name, spec.Trainer.Short(), res.Examples, res.Took.Round(1e6))
	return fl.TrainerOutput(j.Weights, res.Weights, res.Examples, p)
}

// evalWithTrainer is a trainer run's part of an evaluation step: the
// run's trainer, in its sandbox, scores the global model with its
// evaluate on the silo's held-out rows, and the sums it reports are
// released as fl.TrainerEvalRelease says (exact without DP; under DP the
// silo's accuracy and mean loss as one record on the evaluation's grid,
// noised, with the mechanism to charge). A failure is a coded decline.
func (a *Appliance) evalWithTrainer(ctx context.Context, run content.Ref, spec *fl.Canonical, global fl.Global, trainRound int, p fl.Privacy, gridBits int, subject string) ([]float64, []int64, []dp.Mechanism, error) {
	allowed, j, err := a.trainerJob(ctx, spec, global, subject)
	if err != nil {
		return nil, nil, nil, err
	}
	files, err := a.trainerFiles(run, spec, subject)
	if err != nil {
		return nil, nil, nil, err
	}
	defer files.remove()
	if files.held == "" {
		return nil, nil, nil, diag.New(diag.RunBadRound, subject, "the run declares no held-out rows to evaluate on")
	}
	params := spec.Params()
	params["round"] = int64(trainRound)
	j.Mode, j.Data, j.Label, j.Params = trainer.ModeEvaluate, files.held, files.heldLabel, params
	res, err := trainer.Run(ctx, j)
	if err != nil {
		return nil, nil, nil, err
	}
	a.logf("%s: trainer %s (%s) evaluated the global model on %d held-out examples in %v", subject, allowed.Name, spec.Trainer.Short(), res.Examples, res.Took.Round(1e6))
	return fl.TrainerEvalRelease(res.Metrics, res.Examples, p, gridBits)
}
