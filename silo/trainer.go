package silo

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
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

// trainWithTrainer is a trainer run's client step: the run's trainer, in
// its sandbox under the policy's interpreter and limits, trains from the
// global model on the dataset's file, and the update it implies (trained
// weights − global) is released as a built-in model's is (fl.TrainerOutput:
// clipped, on the grid and noised under DP). Whatever the trainer does, its
// failure is a diagnostic (SC95xx): the silo declines and charges nothing.
func (a *Appliance) trainWithTrainer(ctx context.Context, spec *fl.Canonical, global fl.Global, strategy *fl.Strategy, p fl.Privacy, subject string) (fl.ClientOutput, error) {
	allowed, ok := a.Policy.trainer(spec.Trainer)
	if !ok { // CheckRound refused it already; checked again where it runs
		return fl.ClientOutput{}, a.Policy.checkTrainer(RoundRequest{Run: subject, Trainer: spec.Trainer})
	}
	raw, err := a.runBlob(ctx, spec.Trainer)
	if err != nil {
		return fl.ClientOutput{}, fmt.Errorf("fetching trainer %s: %w", spec.Trainer.Short(), err)
	}
	if content.Hash(raw) != spec.Trainer {
		return fl.ClientOutput{}, diag.New(diag.TrainerBad, subject, "the trainer blob does not hash to %s", spec.Trainer.Short()).
			WithHelp("the pool served other bytes; the silo runs only the content its policy allows")
	}
	b, err := trainer.Decode(raw)
	if err != nil {
		return fl.ClientOutput{}, err
	}
	_, layout, err := b.Init()
	if err != nil {
		return fl.ClientOutput{}, err
	}
	w, ok := global.Vector("w")
	if !ok || len(w) != layout.Size() {
		return fl.ClientOutput{}, diag.New(diag.FLDimension, subject, "the global model has %d weights; the trainer's layout has %d", len(w), layout.Size()).
			WithHelp("the run's model is the trainer's init.npy; the round does not fit its run")
	}
	ds, ok := a.Config.Dataset(spec.Spec.Dataset)
	if !ok {
		return fl.ClientOutput{}, diag.New(diag.SiloUnknownDataset, subject, "this silo declares no dataset %q", spec.Spec.Dataset)
	}
	res, err := trainer.Run(ctx, trainer.Job{
		Interpreter: allowed.Interpreter, Bundle: b, Mode: trainer.ModeTrain,
		Data: ds.Path, Label: ds.Label, Weights: w, Layout: layout, Params: strategy.Params,
		Dir:    filepath.Join(a.Config.DataDir, "trainer-jobs"),
		Limits: trainer.Limits{CPUSeconds: allowed.CPUSeconds, MemoryMB: allowed.MemoryMB, Wall: allowed.Wall},
	})
	if err != nil {
		return fl.ClientOutput{}, err
	}
	a.logf("%s: trainer %s (%s) trained on %d examples in %v", subject, allowed.Name, spec.Trainer.Short(), res.Examples, res.Took.Round(1e6))
	return fl.TrainerOutput(w, res.Weights, res.Examples, p)
}
