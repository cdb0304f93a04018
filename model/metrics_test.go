package model

import (
	"math"
	"math/rand/v2"
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
