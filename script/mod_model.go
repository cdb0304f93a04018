package script

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/tensor"
)

// modelValue is a trained *model.Model inside Starlark: an opaque handle
// with attributes kind, inputs, classes, hidden, image and conv (a cnn's
// shape) and size (parameters).
type modelValue struct {
	m *model.Model
	// What model.train did: optimizer steps and example gradients (0 for a
	// handle built from parameters), and AdamW's state after the run (nil
	// unless optimizer was adamw).
	steps, examples int
	adam            *model.AdamState
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
	return []string{"classes", "conv", "examples", "hidden", "image", "inputs", "kind", "size", "steps"}
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
	case "image", "conv":
		v := s.Conv
		if name == "image" {
			if s.Kind != model.KindCNN {
				return starlark.NewList(nil), nil
			}
			v = s.Image[:]
		}
		l := make([]starlark.Value, len(v))
		for i, x := range v {
			l[i] = starlark.MakeInt(x)
		}
		return starlark.NewList(l), nil
	case "size":
		return starlark.MakeInt(len(m.m.Params)), nil
	case "steps":
		return starlark.MakeInt(m.steps), nil
	case "examples":
		return starlark.MakeInt(m.examples), nil
	}
	return nil, nil
}
func (m *modelValue) ownedBytes() uint64 {
	n := 64 + bytesOf(len(m.m.Params))
	if m.adam != nil {
		n += bytesOf(len(m.adam.M)) + bytesOf(len(m.adam.V))
	}
	return n
}

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

// shapeArgs are the arguments that shape a model besides its kind,
// inputs and classes: an mlp's or a cnn's hidden width, a cnn's image
// shape and convolution channels.
type shapeArgs struct {
	hidden int
	image  imageArg
	conv   convArg
}

// imageArg unpacks a cnn's image shape: None, or a list or tuple
// [height, width] or [height, width, channels] (channels 1 when left out).
type imageArg [3]int

func (a *imageArg) Unpack(v starlark.Value) error {
	n, err := intList(v, "image")
	if err != nil || n == nil {
		return err
	}
	switch len(n) {
	case 2:
		*a = imageArg{n[0], n[1], 1}
	case 3:
		*a = imageArg(n)
	default:
		return fmt.Errorf("image must be [height, width] or [height, width, channels], got %d values", len(n))
	}
	return nil
}

// convArg unpacks a cnn's output channels per convolution layer: None, or
// a list or tuple of ints.
type convArg []int

func (a *convArg) Unpack(v starlark.Value) error {
	n, err := intList(v, "conv")
	*a = n
	return err
}

// intList reads None (nil) or a list or tuple of ints.
func intList(v starlark.Value, what string) ([]int, error) {
	if v == starlark.None {
		return nil, nil
	}
	it, ok := v.(starlark.Indexable)
	if !ok {
		return nil, fmt.Errorf("%s must be a list of ints, got %s", what, v.Type())
	}
	out := make([]int, it.Len())
	for i := range out {
		n, err := toInt(it.Index(i), fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// spec is the Spec of a model of kind over inputs with classes and this
// shape.
func (a shapeArgs) spec(kind string, inputs, classes int) model.Spec {
	return model.Spec{Kind: kind, Inputs: inputs, Classes: classes, Hidden: a.hidden, Image: [3]int(a.image), Conv: a.conv}
}

// trainArgs are model.train's arguments.
type trainArgs struct {
	kind        string
	ds          starlark.Value
	epochs      int
	batch       int
	lr, l2      num
	shape       shapeArgs
	seed        uint64
	optimizer   string
	classes     int
	steps       int
	init        starlark.Value
	mu          num
	anchor      starlark.Value
	correction  starlark.Value
	adamState   starlark.Value
	weightDecay num
}

func trainModel(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
	a := trainArgs{kind: model.KindLogistic, epochs: 10, batch: 32, lr: 0.1, optimizer: model.OptSGD,
		init: starlark.None, anchor: starlark.None, correction: starlark.None, adamState: starlark.None}
	if err := unpack("model.train", args, kw, "kind?", &a.kind, "data", &a.ds, "epochs?", &a.epochs, "batch_size?", &a.batch,
		"lr?", &a.lr, "l2?", &a.l2, "hidden?", &a.shape.hidden, "image?", &a.shape.image, "conv?", &a.shape.conv, "seed?", &a.seed, "optimizer?", &a.optimizer,
		"classes?", &a.classes, "steps?", &a.steps, "init?", &a.init, "mu?", &a.mu, "anchor?", &a.anchor,
		"correction?", &a.correction, "adam_state?", &a.adamState, "weight_decay?", &a.weightDecay); err != nil {
		return nil, err
	}
	d, err := st.toDataset(a.ds, "data")
	if err != nil {
		return nil, err
	}
	var init tensor.Vector
	if a.init != starlark.None {
		if init, err = st.toVector(a.init, "init"); err != nil {
			return nil, err
		}
	}
	spec, err := specFor(a.kind, d.Dims(), a.classes, a.shape, len(init), d, "init")
	if err != nil {
		return nil, err
	}
	n := spec.NumParams()
	// Parameters, gradient, optimizer state and the copies below, and a
	// cnn's maps for a minibatch.
	if err := st.reserve(bytesOf2(6, n)+uint64(spec.ConvBytes(min(max(a.batch, 1), d.Rows()))), "model.train"); err != nil {
		return nil, err
	}
	m, err := model.New(spec, a.seed)
	if err != nil {
		return nil, modelError(err)
	}
	if init != nil {
		copy(m.Params, init) // Train works in place; init may be lent by the engine
	}
	if err := m.Check(d); err != nil {
		return nil, modelError(err)
	}
	cfg := model.TrainConfig{Epochs: a.epochs, BatchSize: a.batch, LR: float64(a.lr), L2: float64(a.l2), Seed: a.seed,
		Optimizer: a.optimizer, Steps: a.steps, Mu: float64(a.mu), WeightDecay: float64(a.weightDecay)}
	if a.anchor != starlark.None {
		if cfg.Anchor, err = st.toVector(a.anchor, "anchor"); err != nil {
			return nil, err
		}
	} else if cfg.Mu > 0 {
		return nil, fmt.Errorf("mu = %v needs anchor, the global parameters to stay close to", float64(a.mu))
	}
	if a.correction != starlark.None {
		if cfg.Correction, err = st.toVector(a.correction, "correction"); err != nil {
			return nil, err
		}
	}
	if cfg.Optimizer == model.OptAdamW {
		cfg.Adam = &model.AdamState{}
		if a.adamState != starlark.None {
			if cfg.Adam, err = st.toAdamState(a.adamState, n); err != nil {
				return nil, err
			}
		}
	} else if a.adamState != starlark.None {
		return nil, fmt.Errorf("adam_state is given but optimizer is %q; it needs optimizer=%q", cfg.Optimizer, model.OptAdamW)
	}
	if err := st.env.Training.apply(&cfg, st.dpSteps); err != nil {
		return nil, err
	}
	cfg.Interrupt = st.nativeWork
	stats, err := model.Train(m, d, cfg)
	if err != nil {
		return nil, modelError(err)
	}
	if cfg.DP != nil {
		st.dpSteps += stats.Steps
	}
	if p := st.env.Training; p != nil && p.Trained != nil {
		run := TrainRun{Rows: d.Rows(), Steps: stats.Steps, Examples: stats.Examples}
		if cfg.DP != nil {
			ran := *cfg.DP
			ran.Steps = stats.Steps
			run.DP = &ran
		}
		p.Trained(run)
	}
	return &modelValue{m: m, steps: stats.Steps, examples: stats.Examples, adam: cfg.Adam}, nil
}

// toAdamState reads {"m": vector, "v": vector, "t": int} into a fresh
// AdamState (copies: Train updates the moments in place).
func (st *callState) toAdamState(v starlark.Value, n int) (*model.AdamState, error) {
	d, ok := v.(*starlark.Dict)
	if !ok {
		return nil, fmt.Errorf("adam_state must be None or a dict {m, v, t} (from model.adam_state), got %s", v.Type())
	}
	get := func(k string) (starlark.Value, error) {
		x, found, _ := d.Get(starlark.String(k))
		if !found {
			return nil, fmt.Errorf("adam_state has no %q (want the dict model.adam_state returns)", k)
		}
		return x, nil
	}
	out := &model.AdamState{}
	for _, k := range []string{"m", "v"} {
		x, err := get(k)
		if err != nil {
			return nil, err
		}
		vec, err := st.toVector(x, "adam_state[\""+k+"\"]")
		if err != nil {
			return nil, err
		}
		if len(vec) != n {
			return nil, fmt.Errorf("adam_state[%q] has %d values, the model %d parameters", k, len(vec), n)
		}
		if k == "m" {
			out.M = slices.Clone(vec)
		} else {
			out.V = slices.Clone(vec)
		}
	}
	x, err := get("t")
	if err != nil {
		return nil, err
	}
	if out.T, err = toCount(x, "adam_state[\"t\"]"); err != nil {
		return nil, err
	}
	return out, nil
}

// specFor builds the Spec of a model of kind over inputs features. With
// classes 0 it infers the number of classes: from the length nParams of a
// given parameter vector where the kind makes that unambiguous (softmax; an
// mlp with three or more outputs), else from d's labels (see classesOf).
// With nParams > 0 the Spec must have exactly that many parameters. what
// names the vector in messages.
func specFor(kind string, inputs, classes int, shape shapeArgs, nParams int, d *model.Dataset, what string) (model.Spec, error) {
	hidden := shape.hidden
	if classes == 0 && nParams > 0 {
		switch kind {
		case model.KindSoftmax:
			if nParams%(inputs+1) == 0 {
				classes = nParams / (inputs + 1)
			}
		case model.KindMLP:
			if rest := nParams - hidden*(inputs+1); hidden > 0 && rest > 0 && rest%(hidden+1) == 0 && rest/(hidden+1) >= 3 {
				classes = rest / (hidden + 1)
			}
		}
	}
	if classes == 0 && d != nil {
		classes = classesOf(kind, d)
	}
	spec := shape.spec(kind, inputs, classes)
	if err := spec.Validate(); err != nil {
		return spec, modelError(err)
	}
	if nParams > 0 && spec.NumParams() != nParams {
		return spec, fmt.Errorf("%s has %d values, but a %s model with %d inputs, %d classes and %d hidden units has %d parameters",
			what, nParams, kind, inputs, classes, hidden, spec.NumParams())
	}
	return spec, nil
}

// metricsDict renders model.Evaluate's metrics for content.
func metricsDict(spec model.Spec, met model.Metrics) *starlark.Dict {
	out := starlark.NewDict(7)
	set := func(k string, v starlark.Value) { out.SetKey(starlark.String(k), v) }
	set("n", starlark.MakeInt(met.N))
	set("loss", starlark.Float(met.Loss))
	if isRegression(spec) {
		set("rmse", starlark.Float(met.RMSE))
	} else {
		set("log_loss", starlark.Float(met.LogLoss))
		set("accuracy", starlark.Float(met.Accuracy))
		set("correct", starlark.MakeInt(met.Correct))
		if spec.Kind == model.KindLogistic || spec.Classes == 2 {
			set("auc", starlark.Float(met.AUC))
		}
	}
	return out
}

// paramsModel builds a model handle from a parameter vector (copied).
//
// lend makes the model's parameters the vector itself rather than a copy:
// for a model that only scores (evaluate_params), which never writes them
// (vectors are immutable).
func paramsModel(st *callState, fn, kind string, pv starlark.Value, inputs, classes int, shape shapeArgs, d *model.Dataset, lend bool) (*model.Model, error) {
	p, err := st.toVector(pv, "params")
	if err != nil {
		return nil, err
	}
	if len(p) == 0 {
		return nil, fmt.Errorf("params is empty")
	}
	spec, err := specFor(kind, inputs, classes, shape, len(p), d, "params")
	if err != nil {
		return nil, err
	}
	if lend {
		return &model.Model{Spec: spec, Params: p}, nil
	}
	if err := st.reserve(bytesOf(len(p)), fn); err != nil {
		return nil, err
	}
	return &model.Model{Spec: spec, Params: slices.Clone(p)}, nil
}

var modelModule = makeModule("model", map[string]nativeFunc{
	"train": trainModel,
	"evaluate": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		m, d, err := modelAndData(st, "model.evaluate", args, kw)
		if err != nil {
			return nil, err
		}
		return metricsDict(m.Spec, model.Evaluate(m, d)), nil
	},
	"evaluate_params": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var kind string
		var pv, ds starlark.Value
		var classes int
		var shape shapeArgs
		if err := unpack("model.evaluate_params", args, kw, "kind", &kind, "params", &pv, "data", &ds,
			"classes?", &classes, "hidden?", &shape.hidden, "image?", &shape.image, "conv?", &shape.conv); err != nil {
			return nil, err
		}
		d, err := st.toDataset(ds, "data")
		if err != nil {
			return nil, err
		}
		m, err := paramsModel(st, "model.evaluate_params", kind, pv, d.Dims(), classes, shape, d, true)
		if err != nil {
			return nil, err
		}
		if err := m.Check(d); err != nil {
			return nil, modelError(err)
		}
		return metricsDict(m.Spec, model.Evaluate(m, d)), nil
	},
	"from_params": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var kind string
		var pv starlark.Value
		var inputs, classes int
		var shape shapeArgs
		if err := unpack("model.from_params", args, kw, "kind", &kind, "params", &pv, "inputs", &inputs,
			"classes?", &classes, "hidden?", &shape.hidden, "image?", &shape.image, "conv?", &shape.conv); err != nil {
			return nil, err
		}
		m, err := paramsModel(st, "model.from_params", kind, pv, inputs, classes, shape, nil, false)
		if err != nil {
			return nil, err
		}
		return &modelValue{m: m}, nil
	},
	"init_params": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		kind := model.KindLogistic
		var inputs, classes int
		var shape shapeArgs
		var seed uint64
		if err := unpack("model.init_params", args, kw, "kind?", &kind, "inputs", &inputs,
			"classes?", &classes, "hidden?", &shape.hidden, "image?", &shape.image, "conv?", &shape.conv, "seed?", &seed); err != nil {
			return nil, err
		}
		spec := shape.spec(kind, inputs, classes)
		if err := spec.Validate(); err != nil {
			return nil, modelError(err)
		}
		if err := st.reserve(bytesOf(spec.NumParams()), "model.init_params"); err != nil {
			return nil, err
		}
		m, err := model.New(spec, seed)
		if err != nil {
			return nil, modelError(err)
		}
		return newVector(m.Params), nil
	},
	"params": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mv *modelValue
		if err := unpack("model.params", args, kw, "m", &mv); err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(mv.m.Params)), "model.params"); err != nil {
			return nil, err
		}
		// The handle's parameters, not a copy: a model handle's parameters
		// are never written once content holds it (model.train trains a
		// new model; init is copied in), and vectors are immutable. For a
		// model of d parameters that is d·8 bytes less on a client step.
		return newVector(mv.m.Params), nil
	},
	"adam_state": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mv *modelValue
		if err := unpack("model.adam_state", args, kw, "m", &mv); err != nil {
			return nil, err
		}
		a := mv.adam
		if a == nil {
			return starlark.None, nil
		}
		if err := st.reserve(2*bytesOf(len(a.M))+3*entryBytes, "model.adam_state"); err != nil {
			return nil, err
		}
		out := starlark.NewDict(3)
		out.SetKey(starlark.String("m"), newVector(slices.Clone(a.M)))
		out.SetKey(starlark.String("t"), starlark.MakeInt(a.T))
		out.SetKey(starlark.String("v"), newVector(slices.Clone(a.V)))
		return out, nil
	},
	"predictions": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		m, d, err := modelAndData(st, "model.predictions", args, kw)
		if err != nil {
			return nil, err
		}
		return predictions(st, m, d)
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
	return s.ClassCount() == 0
}

// modelAndData unpacks (m, data) and checks that the model fits the data.
func modelAndData(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (*model.Model, *model.Dataset, error) {
	var mv *modelValue
	var ds starlark.Value
	if err := unpack(name, args, kw, "m", &mv, "data", &ds); err != nil {
		return nil, nil, err
	}
	d, err := st.toDataset(ds, "data")
	if err != nil {
		return nil, nil, err
	}
	if err := mv.m.Check(d); err != nil {
		return nil, nil, modelError(err)
	}
	return mv.m, d, nil
}

// predictions returns (outputs, labels): the model's output for each row of
// d (a probability per class, one value for binary and regression models)
// and d's labels, so content can combine the outputs of several models
// (an ensemble) and score them against the labels.
func predictions(st *callState, m *model.Model, d *model.Dataset) (starlark.Value, error) {
	n := d.Rows()
	if err := st.reserve(listBytes+uint64(n)*(slotBytes+listBytes), "model.predictions"); err != nil {
		return nil, err
	}
	outs := make([]starlark.Value, n)
	for i, p := range m.Predictions(d) {
		if err := st.reserve(bytesOf(len(p)), "model.predictions"); err != nil {
			return nil, err
		}
		outs[i] = newVector(slices.Clone(p))
	}
	labels, err := st.newOwnedVector(n, "model.predictions")
	if err != nil {
		return nil, err
	}
	copy(labels, d.Y)
	return starlark.Tuple{starlark.NewList(outs), newVector(labels)}, nil
}
