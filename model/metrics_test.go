package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAUCAgainstPairs compares the rank formula with counting all pairs.
func TestAUCAgainstPairs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := range 200 {
		n := 1 + r.IntN(40)
		s := make([]float64, n)
		y := make([]float64, n)
		for i := range s {
			s[i] = float64(r.IntN(6)) // many ties
			y[i] = float64(r.IntN(2))
		}
		var num, den float64
		for i := range n {
			for j := range n {
				if y[i] == 1 && y[j] == 0 {
					den++
					switch {
					case s[i] > s[j]:
						num++
					case s[i] == s[j]:
						num += 0.5
					}
				}
			}
		}
		want := 0.0
		if den > 0 {
			want = num / den
		}
		if got := AUC(s, y); math.Abs(got-want) > 1e-12 {
			t.Fatalf("trial %d: AUC %v, pairs %v", trial, got, want)
		}
	}
}

func TestEvaluateKnownModel(t *testing.T) {
	d := logisticData(4, []float64{1}, 0, 1)
	copy(d.X.RawMatrix().Data, []float64{-2, -1, 1, 2})
	copy(d.Y, []float64{0, 1, 1, 1})
	m := &Model{Spec: Spec{Kind: KindLogistic, Inputs: 1}, Params: []float64{1, 0}}
	met := Evaluate(m, d)
	wantLoss := (softplus(-2) + (softplus(-1) + 1) + (softplus(1) - 1) + (softplus(2) - 2)) / 4
	if met.N != 4 || met.Correct != 3 || met.Accuracy != 0.75 || math.Abs(met.LogLoss-wantLoss) > 1e-15 || met.AUC != 1 {
		t.Errorf("metrics %+v, want loss %v", met, wantLoss)
	}
	if met.Loss != m.Loss(d) {
		t.Errorf("Loss %v vs Evaluate %v", m.Loss(d), met.Loss)
	}
	p := m.Predict([]float64{0})
	if len(p) != 1 || p[0] != 0.5 {
		t.Errorf("Predict(0) = %v", p)
	}
	sm := &Model{Spec: Spec{Kind: KindSoftmax, Inputs: 1, Classes: 3}, Params: []float64{1, 0, -1, 0, 0, 0}}
	q := sm.Predict([]float64{2})
	if math.Abs(q[0]+q[1]+q[2]-1) > 1e-15 || !(q[0] > q[1] && q[1] > q[2]) {
		t.Errorf("softmax Predict %v", q)
	}
}

// TestScoringWorkspace: a scoring pass holds evalChunk rows as before for
// every model whose evalChunk rows of activations fit scoringBytes (their
// figures are unchanged, bit for bit: Loss sums block by block, so the
// block size is part of the result), and fewer rows, with no gradient
// buffer, for a wide one. The block size depends on the model's shape
// only, so every process scoring a model gets the same figures.
func TestScoringWorkspace(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		rows int
	}{
		{Spec{Kind: KindLogistic, Inputs: 30}, evalChunk},
		{Spec{Kind: KindMLP, Inputs: 30, Hidden: 2000, Classes: 3}, evalChunk},
		{Spec{Kind: KindMLP, Inputs: 9, Hidden: 4096, Classes: 2}, 127},
		{Spec{Kind: KindMLP, Inputs: 9, Hidden: 90_909, Classes: 2}, 5},
		{Spec{Kind: KindMLP, Inputs: 9, Hidden: 909_090, Classes: 2}, minScoringRows},
		{Spec{Kind: KindLogistic, Inputs: 1 << 20}, 1},
		// A cnn's: 12,299 values a 16×16 glyph (11,520 of im2col, maps
		// and pooled maps with their arg max; the input, dense layer and
		// outputs): 42 rows in 4 MiB.
		{Spec{Kind: KindCNN, Inputs: 256, Classes: 10, Hidden: 512, Image: [3]int{16, 16, 1}, Conv: []int{8, 16}}, 42},
		// A 256×256 colour image's are too many for 4 MiB: the least, four rows.
		{Spec{Kind: KindCNN, Inputs: 256 * 256 * 3, Classes: 10, Image: [3]int{256, 256, 3}, Conv: []int{16}}, minScoringRows},
	} {
		l, err := c.spec.layout()
		if err != nil {
			t.Fatal(err)
		}
		ws := newScoringWorkspace(l, evalChunk)
		if ws.cap != c.rows || ws.dh != nil {
			t.Errorf("%+v: a scoring pass holds %d rows (dh %d), want %d and none", c.spec, ws.cap, len(ws.dh), c.rows)
		}
		if ws.cap > minScoringRows && 8*ws.cap*(l.in+l.hidden+l.out+1+l.convRowFloats(true)) > scoringBytes {
			t.Errorf("%+v: %d rows of activations exceed %d bytes", c.spec, ws.cap, scoringBytes)
		}
	}
	// Scoring in smaller blocks gives the same per-row figures.
	d := classData(600, 3, 4, 8)
	m := mustNew(t, Spec{Kind: KindMLP, Inputs: 3, Hidden: 17, Classes: 4}, 5)
	if got, want := evaluate(m, d, 7), evaluate(m, d, evalChunk); got.Correct != want.Correct || math.Abs(got.Loss-want.Loss) > 1e-12 {
		t.Fatalf("in blocks of 7 rows %+v, of %d rows %+v", got, evalChunk, want)
	}
	// A cnn's too, and Predict (one row at a time) agrees with them.
	d = classData(100, 48, 3, 9)
	m = mustNew(t, Spec{Kind: KindCNN, Inputs: 48, Classes: 3, Hidden: 4, Image: [3]int{4, 4, 3}, Conv: []int{5}}, 5)
	got, want := evaluate(m, d, 7), evaluate(m, d, evalChunk)
	if got.Correct != want.Correct || math.Abs(got.Loss-want.Loss) > 1e-12 || math.Abs(m.Loss(d)-want.Loss) > 1e-12 {
		t.Fatalf("cnn: in blocks of 7 rows %+v, of %d rows %+v, Loss %v", got, evalChunk, want, m.Loss(d))
	}
	var loss float64
	for i := range d.Rows() {
		loss -= math.Log(m.Predict(d.Row(i))[int(d.Y[i])])
	}
	if math.Abs(loss/float64(d.Rows())-want.Loss) > 1e-9 {
		t.Fatalf("cnn: Predict's mean log-loss %v, Evaluate's %v", loss/float64(d.Rows()), want.Loss)
	}
}

// Predictions gives Predict's outputs, bit for bit, for every kind (a
// block of rows computes each row as one row alone does), standardised
// by m.Std as Predict is, and stops when the caller does.
func TestPredictionsArePredicts(t *testing.T) {
	for _, tc := range gradCases {
		m := mustNew(t, tc.spec, 3)
		randomParams(m, 5)
		d := tc.data()
		std := FitStandardizer(d)
		m.Std = &std
		n := 0
		for i, p := range m.Predictions(d) {
			if want := m.Predict(d.Row(i)); !slices.Equal(p, want) || i != n {
				t.Fatalf("%s: row %d (the %dth yielded): Predictions %v, Predict %v", tc.spec.Kind, i, n, p, want)
			}
			n++
		}
		if n != d.Rows() {
			t.Fatalf("%s: %d predictions for %d rows", tc.spec.Kind, n, d.Rows())
		}
		for i := range m.Predictions(d) {
			if i == 2 {
				break
			}
		}
	}
}
