package fl

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

// goFedAvgRound is one FedAvg round written directly in Go: the floor that
// the content path (Starlark strategy, canonical transfer of the global,
// client-state persistence) is measured against.
func goFedAvgRound(b *testing.B, w []float64, sites []*model.Dataset) []float64 {
	sum := make([]float64, len(w))
	var total float64
	for i, d := range sites {
		m := &model.Model{Spec: model.Spec{Kind: model.KindLogistic, Inputs: d.Dims()}, Params: slices.Clone(w)}
		model.Evaluate(m, d) // the client step reports the incoming model's metrics
		if _, err := model.Train(m, d, model.TrainConfig{Epochs: 1, LR: 0.1, Seed: uint64(i)}); err != nil {
			b.Fatal(err)
		}
		n := float64(d.Rows())
		for j := range sum {
			sum[j] += n * (m.Params[j] - w[j])
		}
		total += n
	}
	out := slices.Clone(w)
	for j := range out {
		out[j] += sum[j] / total
	}
	return out
}

// BenchmarkFedAvgRound reports one synchronous FedAvg round over four
// hospital sites of 1,500 rows in one process (sequential client steps),
// and its ratio to the same round hand-written in Go.
func BenchmarkFedAvgRound(b *testing.B) {
	c := builtins(b)
	train, _, _ := hospitalSplits(b, 4, 2000, 1)
	s := load(b, c, "fedavg", map[string]any{"epochs": int64(1), "lr": 0.1})
	const rounds = 5
	var content, native time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := Simulate(context.Background(), s, train, rounds, SimOptions{Env: script.Env{Catalog: c}, Parallel: 1}); err != nil {
			b.Fatal(err)
		}
		content += time.Since(start)
		start = time.Now()
		w := make([]float64, train[0].Dims()+1)
		for range rounds {
			w = goFedAvgRound(b, w, train)
		}
		native += time.Since(start)
	}
	n := float64(b.N * rounds)
	b.ReportMetric(float64(content.Microseconds())/n, "µs/round")
	b.ReportMetric(float64(native.Microseconds())/n, "go-µs/round")
	b.ReportMetric(float64(content)/float64(native), "content/go")
}
