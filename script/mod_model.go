package script

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// modelValue is a trained *model.Model inside Starlark: an opaque handle
// with attributes kind, inputs, classes, hidden and size (parameters).
type modelValue struct {
	m *model.Model
}

var _ starlark.HasAttrs = (*modelValue)(nil)

func (m *modelValue) String() string {
	return fmt.Sprintf("model(%s, %d inputs, %d parameters)", m.m.Spec.Kind, m.m.Spec.Inputs, len(m.m.Params))
}
func (m *modelValue) Type() string          { return "model" }
func (m *modelValue) Freeze()               {}
func (m *modelValue) Truth() starlark.Bool  { return true }
func (m *modelValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: model") }
func (m *modelValue) AttrNames() []string {
	return []string{"classes", "hidden", "inputs", "kind", "size"}
}
func (m *modelValue) Attr(name string) (starlark.Value, error) {
	s := m.m.Spec
	switch name {
	case "kind":
		return starlark.String(s.Kind), nil
	case "inputs":
		return starlark.MakeInt(s.Inputs), nil
	case "classes":
		return starlark.MakeInt(s.Classes), nil
	case "hidden":
		return starlark.MakeInt(s.Hidden), nil
	case "size":
		return starlark.MakeInt(len(m.m.Params)), nil
	}
	return nil, nil
}
func (m *modelValue) ownedBytes() uint64 { return 64 + bytesOf(len(m.m.Params)) }

// modelError keeps the model package's diagnostics about data (too small,
// diverged) and turns those about bad arguments into diag.NativeArgument.
func modelError(err error) error {
	var d *diag.Diagnostic
	if errors.As(err, &d) && d.Code != diag.InvalidValue {
		return d
	}
	if d != nil {
		return diag.New(diag.NativeArgument, "", "%s", d.Message).WithHelp("%s", d.Help)
	}
	return err
}

// classesOf infers Spec.Classes for a kind from the labels: logistic 2,
// linear 1, softmax the largest label + 1, mlp the largest label + 1 when
// every label is a small non-negative integer, else 1 (regression).
func classesOf(kind string, d *model.Dataset) int {
	switch kind {
	case model.KindLogistic:
		return 2
	case model.KindLinear:
		return 1
	}
	maxLabel := 0.0
	for _, y := range d.Y {
		if y < 0 || y != math.Trunc(y) || y > 1<<16 {
			return 1
		}
		maxLabel = max(maxLabel, y)
	}
	k := int(maxLabel) + 1
	if kind == model.KindSoftmax || k >= 2 {
		return max(k, 2)
	}
	return 1
}

var modelModule = makeModule("model", map[string]nativeFunc{
	"train": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var (
			kind      = model.KindLogistic
			ds        starlark.Value
			epochs    = 10
			batch     = 32
			lr        num
			l2        num
			hidden    = 0
			seed      uint64
			optimizer = model.OptSGD
			classes   = 0
			steps     = 0
		)
		lr = 0.1
		if err := unpack("model.train", args, kw, "kind?", &kind, "data", &ds, "epochs?", &epochs, "batch_size?", &batch,
			"lr?", &lr, "l2?", &l2, "hidden?", &hidden, "seed?", &seed, "optimizer?", &optimizer,
			"classes?", &classes, "steps?", &steps); err != nil {
			return nil, err
		}
		d, err := st.toDataset(ds, "data")
		if err != nil {
			return nil, err
		}
		if classes == 0 {
			classes = classesOf(kind, d)
		}
		spec := model.Spec{Kind: kind, Inputs: d.Dims(), Classes: classes, Hidden: hidden}
		if err := spec.Validate(); err != nil {
			return nil, modelError(err)
		}
		// Parameters, gradient and optimizer state.
		if err := st.reserve(4*bytesOf(spec.NumParams()), "model.train"); err != nil {
			return nil, err
		}
		m, err := model.New(spec, seed)
		if err != nil {
			return nil, modelError(err)
		}
		if err := m.Check(d); err != nil {
			return nil, modelError(err)
		}
		cfg := model.TrainConfig{Epochs: epochs, BatchSize: batch, LR: float64(lr), L2: float64(l2), Seed: seed, Optimizer: optimizer, Steps: steps}
		if _, err := model.Train(m, d, cfg); err != nil {
			return nil, modelError(err)
		}
		return &modelValue{m: m}, nil
	},
	"evaluate": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mv *modelValue
		var ds starlark.Value
		if err := unpack("model.evaluate", args, kw, "m", &mv, "data", &ds); err != nil {
			return nil, err
		}
		d, err := st.toDataset(ds, "data")
		if err != nil {
			return nil, err
		}
		if err := mv.m.Check(d); err != nil {
			return nil, modelError(err)
		}
		met := model.Evaluate(mv.m, d)
		out := starlark.NewDict(7)
		set := func(k string, v starlark.Value) { out.SetKey(starlark.String(k), v) }
		set("n", starlark.MakeInt(met.N))
		set("loss", starlark.Float(met.Loss))
		if isRegression(mv.m.Spec) {
			set("rmse", starlark.Float(met.RMSE))
		} else {
			set("log_loss", starlark.Float(met.LogLoss))
			set("accuracy", starlark.Float(met.Accuracy))
			set("correct", starlark.MakeInt(met.Correct))
			if mv.m.Spec.Kind == model.KindLogistic || mv.m.Spec.Classes == 2 {
				set("auc", starlark.Float(met.AUC))
			}
		}
		return out, nil
	},
	"params": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mv *modelValue
		if err := unpack("model.params", args, kw, "m", &mv); err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(mv.m.Params)), "model.params"); err != nil {
			return nil, err
		}
		return newVector(slices.Clone(mv.m.Params)), nil
	},
	"predict": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mv *modelValue
		var x starlark.Value
		if err := unpack("model.predict", args, kw, "m", &mv, "x", &x); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		if len(v) != mv.m.Spec.Inputs {
			return nil, fmt.Errorf("x has %d features, the model %d inputs", len(v), mv.m.Spec.Inputs)
		}
		return newVector(mv.m.Predict(v)), nil
	},
})

func isRegression(s model.Spec) bool {
	return s.Kind == model.KindLinear || (s.Kind == model.KindMLP && s.Classes == 1)
}
