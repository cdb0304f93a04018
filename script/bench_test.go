package script

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/scellis/scellis/tensor"
)

// The benchmark: a content function computing the weighted mean of
// 10 vectors of 10^6 floats through the native tensor module, against the
// same call in plain Go. The ratio of the two is the sandbox's overhead.

const (
	wmVectors = 10
	wmLen     = 1_000_000
)

func weightedMeanInputs() ([]any, []float64, []tensor.Vector) {
	r := rand.New(rand.NewPCG(1, 2))
	vs := make([]tensor.Vector, wmVectors)
	args := make([]any, wmVectors)
	ws := make([]float64, wmVectors)
	for k := range vs {
		vs[k] = make(tensor.Vector, wmLen)
		for i := range vs[k] {
			vs[k][i] = r.NormFloat64()
		}
		args[k] = vs[k]
		ws[k] = float64(k + 1)
	}
	return args, ws, vs
}

func BenchmarkWeightedMeanStarlark(b *testing.B) {
	args, ws, _ := weightedMeanInputs()
	e := entry(b, "wmean.star", `
def run(params, inputs):
    return tensor.weighted_mean(inputs["vectors"], params["weights"])
`)
	wsAny := make([]any, len(ws))
	for i, w := range ws {
		wsAny[i] = w
	}
	params := map[string]any{"weights": wsAny}
	inputs := map[string]any{"vectors": args}
	ctx := context.Background()
	b.SetBytes(wmVectors * wmLen * 8)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Call(ctx, Env{}, e, "run", params, inputs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWeightedMeanGo(b *testing.B) {
	_, ws, vs := weightedMeanInputs()
	b.SetBytes(wmVectors * wmLen * 8)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tensor.WeightedMean(vs, ws); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWeightedMeanRatio alternates the two on every iteration and
// reports starlark/go, the sandbox's overhead measured against a baseline
// in the same run (robust to a machine whose load changes).
func BenchmarkWeightedMeanRatio(b *testing.B) {
	args, ws, vs := weightedMeanInputs()
	e := entry(b, "wmean.star", `
def run(params, inputs):
    return tensor.weighted_mean(inputs["vectors"], params["weights"])
`)
	wsAny := make([]any, len(ws))
	for i, w := range ws {
		wsAny[i] = w
	}
	params := map[string]any{"weights": wsAny}
	inputs := map[string]any{"vectors": args}
	ctx := context.Background()
	var inStarlark, inGo time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := Call(ctx, Env{}, e, "run", params, inputs); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := tensor.WeightedMean(vs, ws); err != nil {
			b.Fatal(err)
		}
		inStarlark += t1.Sub(t0)
		inGo += time.Since(t1)
	}
	b.ReportMetric(float64(inStarlark)/float64(inGo), "starlark/go")
}

// BenchmarkCallTrivial is the fixed cost of one sandboxed call: a fresh
// thread, module initialisation (the compiled program is cached), argument
// and result conversion.
func BenchmarkCallTrivial(b *testing.B) {
	e := entry(b, "trivial.star", `
def run(params, inputs):
    return {"x": params["x"] + 1}
`)
	params := map[string]any{"x": 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Call(ctx, Env{Seed: []byte("s")}, e, "run", params, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStarlarkLoop measures interpreter speed with the guard's
// checkpoints, to size the default step budget.
func BenchmarkStarlarkLoop(b *testing.B) {
	e := entry(b, "loop.star", `
def run(params, inputs):
    n = 0
    for i in range(params["n"]):
        n += i
    return n
`)
	params := map[string]any{"n": 1_000_000}
	ctx := context.Background()
	for b.Loop() {
		if _, err := Call(ctx, Env{}, e, "run", params, nil); err != nil {
			b.Fatal(err)
		}
	}
}
