package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// gradCases covers every model kind and head.
var gradCases = []struct {
	spec Spec
	data func() *Dataset
}{
	{Spec{Kind: KindLogistic, Inputs: 4}, func() *Dataset { return logisticData(30, []float64{1, -2, 0.5, 0}, 0.3, 1) }},
	{Spec{Kind: KindLinear, Inputs: 4}, func() *Dataset { return linearData(30, []float64{1, -2, 0.5, 3}, 1, 0.5, 2) }},
	{Spec{Kind: KindSoftmax, Inputs: 3, Classes: 4}, func() *Dataset { return classData(30, 3, 4, 3) }},
	{Spec{Kind: KindMLP, Inputs: 3, Classes: 1, Hidden: 5}, func() *Dataset { return linearData(30, []float64{1, -1, 2}, 0, 0.1, 4) }},
	{Spec{Kind: KindMLP, Inputs: 4, Classes: 2, Hidden: 6}, func() *Dataset { return logisticData(30, []float64{1, -2, 0.5, 0}, 0, 5) }},
	{Spec{Kind: KindMLP, Inputs: 3, Classes: 3, Hidden: 4}, func() *Dataset { return classData(30, 3, 3, 6) }},
	// cnns: odd sides (a pooled row and column dropped), several
	// channels, with and without a dense layer, every head.
	{Spec{Kind: KindCNN, Inputs: 60, Classes: 3, Image: [3]int{6, 5, 2}, Conv: []int{3, 2}}, func() *Dataset { return classData(12, 60, 3, 7) }},
	{Spec{Kind: KindCNN, Inputs: 16, Classes: 2, Hidden: 3, Image: [3]int{4, 4, 1}, Conv: []int{2}}, func() *Dataset { return logisticData(12, make([]float64, 16), 0.2, 8) }},
	{Spec{Kind: KindCNN, Inputs: 24, Classes: 1, Hidden: 2, Image: [3]int{4, 6, 1}, Conv: []int{2, 2}}, func() *Dataset { return linearData(12, make([]float64, 24), 1, 0.5, 9) }},
}

// randomParams gives every parameter a non-trivial value, so no gradient
// component is tested only at zero.
func randomParams(m *Model, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 9))
	for i := range m.Params {
		m.Params[i] = 0.5 * r.NormFloat64()
	}
}

// TestGradientFiniteDifferences checks the analytic gradient of the summed
// data loss against central differences, for every kind.
func TestGradientFiniteDifferences(t *testing.T) {
	for _, tc := range gradCases {
		t.Run(fmt.Sprintf("%s-c%d-h%d", tc.spec.Kind, tc.spec.Classes, tc.spec.Hidden), func(t *testing.T) {
			m := mustNew(t, tc.spec, 7)
			randomParams(m, 11)
			d := tc.data()
			l, _ := m.check()
			ws := newWorkspace(l, d.Rows())
			raw := d.X.RawMatrix()
			x := rowsView(raw.Data, raw.Stride, 0, d.Rows(), l.in)
			grad := make([]float64, l.n)
			ws.lossGrad(m.Params, x, d.Y, grad)
			f := func() float64 { return ws.lossGrad(m.Params, x, d.Y, nil) }
			checkGrad(t, m.Params, grad, f)
		})
	}
}

// TestObjectiveGradient checks the whole training objective — mean loss,
// L2 on weights, FedProx proximal term, SCAFFOLD correction — through one
// full-batch SGD step: θ' = θ − lr·g, so g = (θ − θ')/lr.
func TestObjectiveGradient(t *testing.T) {
	for _, tc := range gradCases {
		t.Run(fmt.Sprintf("%s-c%d-h%d", tc.spec.Kind, tc.spec.Classes, tc.spec.Hidden), func(t *testing.T) {
			m := mustNew(t, tc.spec, 7)
			randomParams(m, 12)
			d := tc.data()
			l, _ := m.check()
			r := rand.New(rand.NewPCG(5, 5))
			anchor := make([]float64, l.n)
			corr := make([]float64, l.n)
			for i := range anchor {
				anchor[i] = r.NormFloat64()
				corr[i] = 0.1 * r.NormFloat64()
			}
			cfg := TrainConfig{Steps: 1, BatchSize: d.Rows(), LR: 1e-3, L2: 0.3, Mu: 0.7, Anchor: anchor, Correction: corr}
			before := append([]float64(nil), m.Params...)
			if _, err := Train(m, d, cfg); err != nil {
				t.Fatal(err)
			}
			g := make([]float64, l.n)
			for i := range g {
				g[i] = (before[i] - m.Params[i]) / cfg.LR
			}
			mask := l.weightMask()
			p := append([]float64(nil), before...)
			obj := func() float64 {
				mm := &Model{Spec: m.Spec, Params: p}
				v := mm.Loss(d)
				for i := range p {
					v += cfg.L2/2*mask[i]*p[i]*p[i] + cfg.Mu/2*(p[i]-anchor[i])*(p[i]-anchor[i]) + corr[i]*p[i]
				}
				return v
			}
			checkGrad(t, p, g, obj)
		})
	}
}

func checkGrad(t *testing.T, p, grad []float64, f func() float64) {
	t.Helper()
	const h = 1e-6
	for i := range p {
		orig := p[i]
		p[i] = orig + h
		fp := f()
		p[i] = orig - h
		fm := f()
		p[i] = orig
		num := (fp - fm) / (2 * h)
		if diff := math.Abs(num - grad[i]); diff > 1e-5*math.Max(1, math.Abs(num)) {
			t.Errorf("param %d: analytic %.9g, numeric %.9g (diff %.3g)", i, grad[i], num, diff)
		}
	}
}

// TestPerExampleGradientsSum checks that per-example gradients (the DP-SGD
// path) add up to the batch gradient.
func TestPerExampleGradientsSum(t *testing.T) {
	for _, tc := range gradCases {
		m := mustNew(t, tc.spec, 3)
		randomParams(m, 4)
		d := tc.data()
		tr, err := newTrainer(m, d, TrainConfig{Steps: 1, LR: 0.1, DP: &DPSGD{Q: 0.5, Clip: 1, Sigma: 1}})
		if err != nil {
			t.Fatal(err)
		}
		sum := make([]float64, len(m.Params))
		ex := make([]float64, len(m.Params))
		for i := range d.Rows() {
			tr.exampleGrad(i, ex)
			for j, v := range ex {
				sum[j] += v
			}
		}
		l, _ := m.check()
		ws := newWorkspace(l, d.Rows())
		raw := d.X.RawMatrix()
		batch := make([]float64, l.n)
		ws.lossGrad(m.Params, rowsView(raw.Data, raw.Stride, 0, d.Rows(), l.in), d.Y, batch)
		for j := range sum {
			if math.Abs(sum[j]-batch[j]) > 1e-9*math.Max(1, math.Abs(batch[j])) {
				t.Errorf("%s: param %d: per-example sum %g, batch %g", tc.spec.Kind, j, sum[j], batch[j])
			}
		}
	}
}
