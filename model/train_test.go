package model

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
)

// TestLogisticRecoversWeights fits logistic regression to data drawn from a
// known logistic model and checks the weights come back.
func TestLogisticRecoversWeights(t *testing.T) {
	w := []float64{1.5, -2, 0.5, 0, 1}
	b := -0.5
	d := logisticData(20000, w, b, 42)
	m := mustNew(t, Spec{Kind: KindLogistic, Inputs: len(w)}, 1)
	st, err := Train(m, d, TrainConfig{Epochs: 20, BatchSize: 64, LR: 0.05, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for j, want := range w {
		if got := m.Params[j]; math.Abs(got-want) > 0.1 {
			t.Errorf("w[%d] = %.3f, want %.3f ± 0.1", j, got, want)
		}
	}
	if got := m.Params[len(w)]; math.Abs(got-b) > 0.1 {
		t.Errorf("b = %.3f, want %.3f ± 0.1", got, b)
	}
	if st.Steps != 20*((20000+63)/64) || st.Examples != 20*20000 {
		t.Errorf("stats %+v", st)
	}
	met := Evaluate(m, d)
	if math.Abs(met.Loss-st.FinalLoss) > 1e-12 || met.AUC < 0.85 {
		t.Errorf("metrics %+v, final loss %v", met, st.FinalLoss)
	}
}

func TestLinearRecoversWeights(t *testing.T) {
	w := []float64{2, -1, 0.5}
	d := linearData(5000, w, 3, 0.1, 7)
	for _, opt := range []string{OptSGD, OptAdamW} {
		m := mustNew(t, Spec{Kind: KindLinear, Inputs: 3}, 1)
		if _, err := Train(m, d, TrainConfig{Epochs: 30, BatchSize: 32, LR: 0.01, Optimizer: opt}); err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(w), 3)
		for j := range want {
			if math.Abs(m.Params[j]-want[j]) > 0.05 {
				t.Errorf("%s: param %d = %.3f, want %.3f", opt, j, m.Params[j], want[j])
			}
		}
		if rmse := Evaluate(m, d).RMSE; rmse > 0.12 {
			t.Errorf("%s: RMSE %.3f, want ≈ 0.1", opt, rmse)
		}
	}
}

func TestSoftmaxAndMLPLearn(t *testing.T) {
	d := classData(3000, 4, 3, 9)
	train, test, err := Split(d, 0.25, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []Spec{
		{Kind: KindSoftmax, Inputs: 4, Classes: 3},
		{Kind: KindMLP, Inputs: 4, Classes: 3, Hidden: 16},
	} {
		m := mustNew(t, spec, 5)
		s := FitStandardizer(train)
		m.Std = &s
		if _, err := Train(m, train, TrainConfig{Epochs: 15, BatchSize: 32, LR: 0.01, Optimizer: OptAdamW, Seed: 2}); err != nil {
			t.Fatal(err)
		}
		if acc := Evaluate(m, test).Accuracy; acc < 0.9 {
			t.Errorf("%s: test accuracy %.3f, want ≥ 0.9", spec.Kind, acc)
		}
	}
}

// TestMLPLearnsXOR needs the hidden layer: no linear model separates XOR.
func TestMLPLearnsXOR(t *testing.T) {
	d := logisticData(2000, []float64{0, 0}, 0, 3)
	for i := range d.Rows() {
		x := d.Row(i)
		d.Y[i] = 0
		if (x[0] > 0) != (x[1] > 0) {
			d.Y[i] = 1
		}
	}
	m := mustNew(t, Spec{Kind: KindMLP, Inputs: 2, Classes: 2, Hidden: 16}, 1)
	if _, err := Train(m, d, TrainConfig{Epochs: 60, BatchSize: 32, LR: 0.01, Optimizer: OptAdamW}); err != nil {
		t.Fatal(err)
	}
	if acc := Evaluate(m, d).Accuracy; acc < 0.93 {
		t.Errorf("XOR accuracy %.3f, want ≥ 0.93", acc)
	}
}

// TestTrainDeterministic: the replayable tier needs byte-identical Params.
func TestTrainDeterministic(t *testing.T) {
	cases := []struct {
		spec Spec
		d    *Dataset
		cfg  TrainConfig
	}{
		{Spec{Kind: KindLogistic, Inputs: 5}, logisticData(1000, []float64{1, 2, 3, 4, 5}, 0, 1), TrainConfig{Epochs: 3, BatchSize: 50, LR: 0.1, L2: 0.01, Seed: 9}},
		{Spec{Kind: KindSoftmax, Inputs: 6, Classes: 5}, classData(1000, 6, 5, 2), TrainConfig{Steps: 77, BatchSize: 33, LR: 0.01, Optimizer: OptAdamW, WeightDecay: 0.01, Seed: 9}},
		{Spec{Kind: KindMLP, Inputs: 6, Classes: 5, Hidden: 70}, classData(1000, 6, 5, 3), TrainConfig{Epochs: 2, BatchSize: 200, LR: 0.01, Seed: 9}},
		{Spec{Kind: KindCNN, Inputs: 64, Classes: 3, Hidden: 5, Image: [3]int{8, 8, 1}, Conv: []int{3, 4}}, classData(200, 64, 3, 4), TrainConfig{Epochs: 2, BatchSize: 16, LR: 0.01, Seed: 9}},
	}
	for _, tc := range cases {
		run := func() []float64 {
			m := mustNew(t, tc.spec, 4)
			if _, err := Train(m, tc.d, tc.cfg); err != nil {
				t.Fatal(err)
			}
			return m.Params
		}
		a, b := run(), run()
		if !slices.Equal(a, b) {
			t.Errorf("%s: two runs with the same seed differ", tc.spec.Kind)
		}
		tc.cfg.Seed++
		if c := run(); slices.Equal(a, c) {
			t.Errorf("%s: a different seed gave the same parameters", tc.spec.Kind)
		}
	}
}

// TestNewDeterministic: initialisation depends on the seed only (mlp).
func TestNewDeterministic(t *testing.T) {
	spec := Spec{Kind: KindMLP, Inputs: 5, Classes: 3, Hidden: 8}
	a, b, c := mustNew(t, spec, 1), mustNew(t, spec, 1), mustNew(t, spec, 2)
	if !slices.Equal(a.Params, b.Params) || slices.Equal(a.Params, c.Params) {
		t.Error("mlp initialisation is not a function of the seed")
	}
	if len(a.Params) != spec.NumParams() || spec.NumParams() != 8*5+8+3*8+3 {
		t.Errorf("mlp has %d params, NumParams %d", len(a.Params), spec.NumParams())
	}
	cnn := Spec{Kind: KindCNN, Inputs: 48, Classes: 3, Hidden: 4, Image: [3]int{4, 4, 3}, Conv: []int{5}}
	a, b, c = mustNew(t, cnn, 1), mustNew(t, cnn, 1), mustNew(t, cnn, 2)
	if !slices.Equal(a.Params, b.Params) || slices.Equal(a.Params, c.Params) {
		t.Error("cnn initialisation is not a function of the seed")
	}
	// 5 kernels of 3·3·3 and their biases, a 2×2×5 map to 4 units, 3 outputs.
	if want := 5*27 + 5 + 4*20 + 4 + 3*4 + 3; len(a.Params) != want || cnn.NumParams() != want {
		t.Errorf("cnn has %d params, NumParams %d, want %d", len(a.Params), cnn.NumParams(), want)
	}
	for _, v := range mustNew(t, Spec{Kind: KindSoftmax, Inputs: 3, Classes: 4}, 9).Params {
		if v != 0 {
			t.Fatal("convex models must start at zero")
		}
	}
}

// TestFedProxPullsTowardsAnchor: the proximal term keeps local training near
// the anchor, more so as mu grows.
func TestFedProxPullsTowardsAnchor(t *testing.T) {
	d := logisticData(2000, []float64{2, -2, 1}, 0, 5)
	anchor := []float64{-1, 1, -1, 0.5}
	dist := func(mu float64) float64 {
		m := mustNew(t, Spec{Kind: KindLogistic, Inputs: 3}, 1)
		copy(m.Params, anchor)
		if _, err := Train(m, d, TrainConfig{Epochs: 5, BatchSize: 32, LR: 0.05, Mu: mu, Anchor: anchor}); err != nil {
			t.Fatal(err)
		}
		var s float64
		for i := range anchor {
			s += (m.Params[i] - anchor[i]) * (m.Params[i] - anchor[i])
		}
		return math.Sqrt(s)
	}
	d0, d1, d10 := dist(0), dist(1), dist(10)
	if !(d10 < d1 && d1 < d0) {
		t.Errorf("distance to anchor: mu=0 %.3f, mu=1 %.3f, mu=10 %.3f; want decreasing", d0, d1, d10)
	}
	// With a large mu (lr·mu < 2 keeps SGD stable) the model barely leaves
	// the anchor: the data gradient is bounded, so the offset is O(1/mu).
	if d := dist(30); d > 0.1 {
		t.Errorf("mu=30 left the model %.4f from the anchor", d)
	}
}

// TestCorrectionShiftsGradient: a constant SCAFFOLD correction c moves the
// optimum of a convex objective exactly as an added linear term ⟨c, θ⟩ does.
func TestCorrectionShiftsGradient(t *testing.T) {
	d := linearData(500, []float64{1}, 0, 0.01, 3)
	m := mustNew(t, Spec{Kind: KindLinear, Inputs: 1}, 1)
	corr := []float64{0.2, 0}
	if _, err := Train(m, d, TrainConfig{Epochs: 200, BatchSize: 500, LR: 0.5, Correction: corr}); err != nil {
		t.Fatal(err)
	}
	// Minimiser of mean ½(wx+b−y)² + 0.2w with E[x²]≈1: w ≈ 1 − 0.2/E[x²].
	if math.Abs(m.Params[0]-0.8) > 0.1 {
		t.Errorf("w = %.3f, want ≈ 0.8", m.Params[0])
	}
}

func TestTrainRefusesBadInput(t *testing.T) {
	d := logisticData(10, []float64{1, 1}, 0, 1)
	bad := []struct {
		name string
		spec Spec
		d    *Dataset
		cfg  TrainConfig
		code diag.Code
	}{
		{"no length", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{LR: 0.1}, diag.InvalidValue},
		{"zero lr", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{Epochs: 1}, diag.InvalidValue},
		{"optimizer", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{Epochs: 1, LR: 1, Optimizer: "adam"}, diag.InvalidValue},
		{"anchor length", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{Epochs: 1, LR: 1, Mu: 1, Anchor: []float64{1}}, diag.InvalidValue},
		{"dims", Spec{Kind: KindLogistic, Inputs: 3}, d, TrainConfig{Epochs: 1, LR: 1}, diag.InvalidValue},
		{"labels", Spec{Kind: KindLogistic, Inputs: 3}, classData(10, 3, 3, 1), TrainConfig{Epochs: 1, LR: 1}, diag.InvalidValue},
		{"empty", Spec{Kind: KindLogistic, Inputs: 2}, d.Subset(nil), TrainConfig{Epochs: 1, LR: 1}, diag.DatasetTooSmall},
		{"dp q", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{Epochs: 1, LR: 1, DP: &DPSGD{Q: 0, Clip: 1, Sigma: 1}}, diag.InvalidValue},
		{"dp sigma", Spec{Kind: KindLogistic, Inputs: 2}, d, TrainConfig{Epochs: 1, LR: 1, DP: &DPSGD{Q: 0.1, Clip: 1}}, diag.InvalidValue},
		{"diverges", Spec{Kind: KindLinear, Inputs: 2}, linearData(100, []float64{1e3, 1e3}, 0, 0, 1), TrainConfig{Epochs: 50, LR: 1e3}, diag.NonFinite},
	}
	for _, tc := range bad {
		m := mustNew(t, tc.spec, 1)
		_, err := Train(m, tc.d, tc.cfg)
		var dg *diag.Diagnostic
		if !errors.As(err, &dg) || dg.Code != tc.code {
			t.Errorf("%s: got %v, want diagnostic %s", tc.name, err, tc.code)
		}
	}
	for _, spec := range []Spec{
		{Kind: "svm", Inputs: 2}, {Kind: KindLogistic}, {Kind: KindLogistic, Inputs: 2, Classes: 3},
		{Kind: KindSoftmax, Inputs: 2, Classes: 1}, {Kind: KindMLP, Inputs: 2, Classes: 2},
		{Kind: KindMLP, Inputs: 2, Hidden: 3}, {Kind: KindLinear, Inputs: 2, Hidden: 3},
		{Kind: KindMLP, Inputs: 1 << 20, Classes: 2, Hidden: 1 << 10},
	} {
		if _, err := New(spec, 1); err == nil {
			t.Errorf("New(%+v) accepted", spec)
		}
	}
}

func TestStandardizerInModel(t *testing.T) {
	// Features on wildly different scales: Std in the model makes SGD work
	// and Predict/Evaluate apply the same transform to raw rows.
	d := logisticData(3000, []float64{1, -1}, 0, 8)
	raw := d.X.RawMatrix()
	for i := range d.Rows() {
		raw.Data[i*raw.Stride] = raw.Data[i*raw.Stride]*1000 + 5000
	}
	s := FitStandardizer(d)
	m := mustNew(t, Spec{Kind: KindLogistic, Inputs: 2}, 1)
	m.Std = &s
	if _, err := Train(m, d, TrainConfig{Epochs: 10, LR: 0.1}); err != nil {
		t.Fatal(err)
	}
	if math.Abs(m.Params[0]-1) > 0.15 || math.Abs(m.Params[1]+1) > 0.15 {
		t.Errorf("standardised weights %v, want ≈ [1 -1]", m.Params[:2])
	}
	p := m.Predict(d.Row(0))
	sd := s.Apply(d.Subset([]int{0}))
	plain := &Model{Spec: m.Spec, Params: m.Params}
	if q := plain.Predict(sd.Row(0)); math.Abs(p[0]-q[0]) > 1e-15 {
		t.Errorf("Predict with Std %v, on pre-standardised row %v", p, q)
	}
	if Evaluate(m, d) != Evaluate(plain, s.Apply(d)) {
		t.Error("Evaluate with Std differs from Evaluate on standardised data")
	}
}

// TestAdamStateCarriesOver: a shared AdamState continues one optimizer across
// Train calls (its step count and moments carry over), which a fresh
// optimizer on the same second call does not reproduce.
func TestAdamStateCarriesOver(t *testing.T) {
	d := classData(500, 4, 3, 2)
	cfg := TrainConfig{Steps: 40, BatchSize: 16, LR: 0.01, Optimizer: OptAdamW, Seed: 1}
	m := mustNew(t, Spec{Kind: KindSoftmax, Inputs: 4, Classes: 3}, 1)
	var st AdamState
	cfg.Adam = &st
	if _, err := Train(m, d, cfg); err != nil {
		t.Fatal(err)
	}
	if st.T != 40 || len(st.M) != len(m.Params) || len(st.V) != len(m.Params) {
		t.Fatalf("state after first call: T=%d, %d/%d moments", st.T, len(st.M), len(st.V))
	}
	fresh := m.Clone()
	if _, err := Train(m, d, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Adam = nil
	if _, err := Train(fresh, d, cfg); err != nil {
		t.Fatal(err)
	}
	if st.T != 80 || slices.Equal(m.Params, fresh.Params) {
		t.Errorf("T=%d; carried-over and fresh moments gave the same parameters", st.T)
	}
	bad := AdamState{M: []float64{1}, V: []float64{1}, T: 3}
	cfg.Adam = &bad
	if _, err := Train(fresh, d, cfg); err == nil {
		t.Error("AdamState of the wrong length accepted")
	}
}
