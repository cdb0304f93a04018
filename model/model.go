package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/scellis/scellis/diag"
)

// Model is a Spec with its parameters in the canonical flat layout. When Std
// is set, every input (Predict, Loss, Evaluate, Train) is standardised by it
// first; leave it nil for data that is already standardised.
type Model struct {
	Spec   Spec
	Params []float64
	Std    *Standardizer
}

// New returns a model with deterministic initial parameters. Logistic,
// softmax and linear models (convex) start at zero, whatever the seed; an mlp
// draws its weights from the Glorot uniform distribution with a generator
// keyed by seed, and starts its biases at zero; a cnn draws its kernels
// from He's uniform distribution (±√(6/fan-in)) and its dense weights as
// an mlp does, from the same generator in layer order.
func New(spec Spec, seed uint64) (*Model, error) {
	l, err := spec.layout()
	if err != nil {
		return nil, err
	}
	m := &Model{Spec: spec, Params: make([]float64, l.n)}
	if l.hidden > 0 || l.conv != nil {
		r := newRand("init", seed)
		// uniform fills w from [−a, a).
		uniform := func(w []float64, a float64) {
			for i := range w {
				// 2u − 1 for u uniform on [0, 1) in steps of 2⁻⁵³, as
				// (k − 2⁵²)·2⁻⁵²: exact, with no multiply-add to fuse.
				k := int64(r.Uint64() >> 11)
				w[i] = a * (float64(k-1<<52) * 0x1p-52)
			}
		}
		glorot := func(w []float64, fanIn, fanOut int) { uniform(w, math.Sqrt(6/float64(fanIn+fanOut))) }
		// A convolution feeds a ReLU: He's uniform bound √(6/fan-in)
		// keeps the activations' scale from layer to layer.
		for _, c := range l.conv {
			uniform(m.Params[c.wOff:c.bOff], math.Sqrt(6/float64(c.taps())))
		}
		if l.hidden > 0 {
			glorot(m.Params[l.w1:l.b1], l.dense, l.hidden)
		}
		glorot(m.Params[l.w2:l.b2], l.feed(), l.out)
	}
	return m, nil
}

// Clone returns a deep copy of m.
func (m *Model) Clone() *Model {
	c := &Model{Spec: m.Spec, Params: slices.Clone(m.Params)}
	if m.Std != nil {
		c.Std = &Standardizer{Mean: slices.Clone(m.Std.Mean), Std: slices.Clone(m.Std.Std)}
	}
	return c
}

// check resolves m's layout and verifies its parameter count.
func (m *Model) check() (layout, error) {
	if m == nil {
		return layout{}, fmt.Errorf("model: nil model")
	}
	l, err := m.Spec.layout()
	if err != nil {
		return l, err
	}
	if len(m.Params) != l.n {
		return l, diag.New(diag.InvalidValue, "model "+m.Spec.Kind, "has %d parameters, its spec needs %d", len(m.Params), l.n).
			WithHelp("build models with model.New, or keep Params in the canonical layout")
	}
	if m.Std != nil && (len(m.Std.Mean) != l.in || len(m.Std.Std) != l.in) {
		return l, diag.New(diag.InvalidValue, "model "+m.Spec.Kind, "standardizer has %d features, the model %d inputs", len(m.Std.Mean), l.in)
	}
	return l, nil
}

// Predict returns the model's output for one example of raw features x:
// [P(y=1)] for a binary model, the K class probabilities for a multi-class
// model, [ŷ] for regression. It panics if m is malformed or len(x) differs
// from Spec.Inputs; it is safe for concurrent use.
func (m *Model) Predict(x []float64) []float64 {
	l, err := m.check()
	if err != nil {
		panic(err)
	}
	if len(x) != l.in {
		panic(fmt.Sprintf("model: Predict got %d features, the model has %d inputs", len(x), l.in))
	}
	ws := newScoringWorkspace(l, 1)
	if m.Std != nil {
		m.Std.applyRow(ws.xb, x)
		x = ws.xb[:l.in]
	}
	ws.forward(m.Params, rowView(x))
	out := slices.Clone(ws.z[:l.out])
	switch l.head {
	case headSigmoid:
		out[0] = sigmoid(out[0])
	case headSoftmax:
		softmaxInPlace(out)
	}
	return out
}
