package aggregator

import (
	"context"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/trainer"
)

// initialGlobal is round 0's global state: the strategy's init, or — for a
// warm start — init with every vector replaced by the warm-start model's
// vector of that name. Counters and other plain values stay init's (the
// run starts its own rounds). A warm-start model whose vectors do not
// match init's names and lengths is refused with SC9312.
func (n *Node) initialGlobal(ctx context.Context, env script.Env, strat *fl.Strategy, rc *runCtx) (fl.Global, error) {
	spec := rc.canon.Spec
	var global fl.Global
	var err error
	if rc.canon.Trainer != "" {
		global, err = n.trainerGlobal(ctx, rc)
	} else {
		global, err = fl.Init(ctx, env, strat, spec.Model.Inputs)
	}
	if err != nil || spec.WarmStart == "" {
		return global, err
	}
	b, err := n.fetchBlob(ctx, spec.WarmStart)
	if err != nil {
		return nil, err
	}
	_, warm, err := fl.DecodeRoundResult(b)
	if err != nil {
		return nil, diag.New(diag.RunWarmStart, "run "+spec.Name, "warm start %s is not a round result: %v", spec.WarmStart.Short(), err).
			WithHelp("warm-start from a run that completed at least one round: scellis fl launch --warm-start RUN")
	}
	return warmGlobal(spec.Name, global, warm)
}

// warmGlobal puts warm's vectors into global, checking their shapes.
func warmGlobal(run string, global, warm fl.Global) (fl.Global, error) {
	var problems diag.List
	out := fl.Global{}
	keys := make([]string, 0, len(global))
	for k := range global {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out[k] = global[k]
		v, isVec := global.Vector(k)
		if !isVec {
			continue
		}
		w, ok := warm.Vector(k)
		switch {
		case !ok:
			problems = append(problems, diag.New(diag.RunWarmStart, "run "+run, "the warm-start model has no vector %q (the run's model has %d values there)", k, len(v)).
				WithHelp("warm-start from a run of the same strategy and model"))
		case len(w) != len(v):
			problems = append(problems, diag.New(diag.RunWarmStart, "run "+run, "the warm-start model's %q has %d values; this run's model has %d", k, len(w), len(v)).
				WithHelp("the model, its inputs (features) and classes must match the run warm-started from"))
		default:
			out[k] = slices.Clone(w)
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return out, nil
}

// trainerGlobal is a trainer run's initial model: the trainer bundle's
// init.npy (no Python runs on an aggregator).
func (n *Node) trainerGlobal(ctx context.Context, rc *runCtx) (fl.Global, error) {
	b, err := n.fetchBlob(ctx, rc.canon.Trainer)
	if err != nil {
		return nil, err
	}
	if content.Hash(b) != rc.canon.Trainer {
		return nil, fmt.Errorf("the trainer blob does not hash to %s", rc.canon.Trainer.Short())
	}
	tb, err := trainer.Decode(b)
	if err != nil {
		return nil, err
	}
	return fl.TrainerGlobal(tb)
}
