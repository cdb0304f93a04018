package model

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkTrainEpochLogistic: one epoch of logistic regression (batch 32,
// SGD) on 10,000 rows × 20 features.
func BenchmarkTrainEpochLogistic(b *testing.B) {
	w := make([]float64, 20)
	for i := range w {
		w[i] = float64(i%5) - 2
	}
	d := logisticData(10000, w, 0.5, 1)
	for _, opt := range []string{OptSGD, OptAdamW} {
		b.Run(fmt.Sprintf("10kx20/%s", opt), func(b *testing.B) {
			m := mustNew(b, Spec{Kind: KindLogistic, Inputs: 20}, 1)
			cfg := TrainConfig{Epochs: 1, BatchSize: 32, LR: 0.05, Optimizer: opt}
			b.ReportAllocs()
			for b.Loop() {
				clear(m.Params) // every epoch starts from the same model
				if _, err := Train(m, d, cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(d.Rows())*float64(b.N)/b.Elapsed().Seconds(), "examples/s")
		})
	}
	b.Run("10kx20/dpsgd", func(b *testing.B) {
		m := mustNew(b, Spec{Kind: KindLogistic, Inputs: 20}, 1)
		// q = 32/n and 1/q steps: one expected epoch.
		cfg := TrainConfig{Epochs: 1, LR: 0.05, DP: &DPSGD{Q: 32.0 / 10000, Clip: 1, Sigma: 1}}
		b.ReportAllocs()
		for b.Loop() {
			clear(m.Params)
			if _, err := Train(m, d, cfg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(d.Rows())*float64(b.N)/b.Elapsed().Seconds(), "examples/s")
	})
}

// BenchmarkTrainEpochMLP: one epoch of a 64-unit MLP, 10 classes, on
// 10,000 × 60 (the shape of Synthetic(α, β)).
func BenchmarkTrainEpochMLP(b *testing.B) {
	d := classData(10000, 60, 10, 1)
	init := mustNew(b, Spec{Kind: KindMLP, Inputs: 60, Classes: 10, Hidden: 64}, 1)
	m := init.Clone()
	cfg := TrainConfig{Epochs: 1, BatchSize: 32, LR: 0.01}
	b.ReportAllocs()
	for b.Loop() {
		copy(m.Params, init.Params)
		if _, err := Train(m, d, cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(d.Rows())*float64(b.N)/b.Elapsed().Seconds(), "examples/s")
}

// BenchmarkCNNEpoch: one epoch (batch 32, SGD) of the cnn of
// docs/models.md — 16×16 images, convolutions of 8 and 16 channels, a
// dense layer of 512, ten classes: 137,962 parameters — alternated with
// an mlp of at least as many parameters (hidden 517: 138,049) on the same
// 300 rows, reported as cnn/mlp: what a silo's client step pays for the
// convolutions, against a baseline measured in the same run. Under
// -short, 8×8 images, 30 rows and a dense layer of 16.
func BenchmarkCNNEpoch(b *testing.B) {
	side, rows, hidden, mlpHidden := 16, 300, 512, 517
	if testing.Short() {
		side, rows, hidden, mlpHidden = 8, 30, 16, 16
	}
	d := classData(rows, side*side, 10, 1)
	cnn := mustNew(b, Spec{Kind: KindCNN, Inputs: side * side, Classes: 10, Hidden: hidden, Image: [3]int{side, side, 1}, Conv: []int{8, 16}}, 1)
	mlp := mustNew(b, Spec{Kind: KindMLP, Inputs: side * side, Classes: 10, Hidden: mlpHidden}, 1)
	cfg := TrainConfig{Epochs: 1, BatchSize: 32, LR: 0.01}
	var tc, tm time.Duration
	for b.Loop() {
		for _, m := range []*Model{cnn, mlp} {
			p := slices.Clone(m.Params)
			t0 := time.Now()
			if _, err := Train(&Model{Spec: m.Spec, Params: p}, d, cfg); err != nil {
				b.Fatal(err)
			}
			if m == cnn {
				tc += time.Since(t0)
			} else {
				tm += time.Since(t0)
			}
		}
	}
	b.ReportMetric(float64(tc)/float64(tm), "cnn/mlp")
	b.ReportMetric(float64(tc.Microseconds())/float64(b.N*rows), "cnn-µs/row")
}
