package script

import (
	"context"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/tensor"
)

// pipeline runs partition → run → reduce the way the job engine does: shard
// params overlaid on the job params, results in shard-index order.
func pipeline(t *testing.T, c *catalog.Catalog, part string, partParams map[string]any, prog string, params map[string]any, inputs map[string]any, red string, redParams map[string]any) any {
	t.Helper()
	ctx := context.Background()
	shards, err := Call(ctx, Env{Catalog: c}, lookup(t, c, part), "partition", partParams)
	if err != nil {
		t.Fatal(err)
	}
	var rows []any
	for i, sh := range shards.([]any) {
		p := map[string]any{}
		for k, v := range params {
			p[k] = v
		}
		for k, v := range sh.(map[string]any) {
			p[k] = v
		}
		v, err := Call(ctx, Env{Catalog: c, Seed: []byte{byte(i), 42}}, lookup(t, c, prog), "run", p, inputs)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, map[string]any{"index": int64(i), "params": sh, "value": v})
	}
	out, err := Call(ctx, Env{Catalog: c}, lookup(t, c, red), "reduce", rows, redParams)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func callBuiltin(t *testing.T, c *catalog.Catalog, name, fn string, args ...any) (any, error) {
	t.Helper()
	return Call(context.Background(), Env{Catalog: c, Seed: []byte("s")}, lookup(t, c, name), fn, args...)
}

func mustBuiltin(t *testing.T, c *catalog.Catalog, name, fn string, args ...any) any {
	t.Helper()
	v, err := callBuiltin(t, c, name, fn, args...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func rows(values ...any) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = map[string]any{"index": int64(i), "params": map[string]any{"i": int64(i)}, "value": v}
	}
	return out
}

func TestBuiltinKinds(t *testing.T) {
	c := builtins(t)
	want := map[string]catalog.Kind{
		"grid": catalog.Partitioner, "range": catalog.Partitioner, "kfold": catalog.Partitioner, "items": catalog.Partitioner,
		"collect": catalog.Reducer, "sum": catalog.Reducer, "mean": catalog.Reducer, "histogram": catalog.Reducer,
		"argmin": catalog.Reducer, "argmax": catalog.Reducer, "concat": catalog.Reducer, "ensemble": catalog.Reducer,
		"montecarlo-pi": catalog.Program, "train-eval": catalog.Program, "matmul": catalog.Program,
		"numeric": catalog.Library, "select": catalog.Library, "fl-common": catalog.Library,
		"fedavg": catalog.Strategy, "fedprox": catalog.Strategy, "scaffold": catalog.Strategy,
		"diloco": catalog.Strategy, "fedbuff": catalog.Strategy,
		"flat": catalog.Topology, "tree": catalog.Topology,
	}
	for name, kind := range want {
		e := lookup(t, c, name)
		if e.Kind != kind {
			t.Errorf("%s is a %s, want %s", name, e.Kind, kind)
		}
		if !strings.HasPrefix(e.Doc, name+":") {
			t.Errorf("%s: docstring should start with %q, got %q", name, name+":", e.Doc)
		}
	}
	if n := len(c.List()); n != len(want) {
		t.Errorf("%d built-in entries, the test knows %d", n, len(want))
	}
}

func TestPartitioners(t *testing.T) {
	c := builtins(t)
	grid := mustBuiltin(t, c, "grid", "partition", map[string]any{"lr": []any{0.1, 0.01}, "l2": []any{0.0, 1e-3}, "model": "logistic"})
	want := []any{
		map[string]any{"l2": 0.0, "lr": 0.1, "model": "logistic"},
		map[string]any{"l2": 0.0, "lr": 0.01, "model": "logistic"},
		map[string]any{"l2": 1e-3, "lr": 0.1, "model": "logistic"},
		map[string]any{"l2": 1e-3, "lr": 0.01, "model": "logistic"},
	}
	if !reflect.DeepEqual(grid, want) {
		t.Errorf("grid = %v", grid)
	}
	if g := mustBuiltin(t, c, "grid", "partition", map[string]any{"lr": []any{}}); len(g.([]any)) != 0 {
		t.Errorf("grid over an empty list = %v, want no shards", g)
	}
	rng := mustBuiltin(t, c, "range", "partition", map[string]any{"start": 10, "count": 10, "chunks": 3})
	wantRange := []any{
		map[string]any{"chunk": int64(0), "start": int64(10), "count": int64(4)},
		map[string]any{"chunk": int64(1), "start": int64(14), "count": int64(3)},
		map[string]any{"chunk": int64(2), "start": int64(17), "count": int64(3)},
	}
	if !reflect.DeepEqual(rng, wantRange) {
		t.Errorf("range = %v", rng)
	}
	_, err := callBuiltin(t, c, "range", "partition", map[string]any{"count": 2, "chunks": 3})
	d := wantDiag(t, err, diag.StarlarkRuntime)
	if d.Pos.File != "builtin/range.star" || !strings.Contains(d.Message, "chunks must be between 1 and count") {
		t.Errorf("range error: %v", d.Error())
	}
	kf := mustBuiltin(t, c, "kfold", "partition", map[string]any{"k": 3})
	if !reflect.DeepEqual(kf, []any{
		map[string]any{"fold": int64(0), "k": int64(3)},
		map[string]any{"fold": int64(1), "k": int64(3)},
		map[string]any{"fold": int64(2), "k": int64(3)},
	}) {
		t.Errorf("kfold = %v", kf)
	}
	_, err = callBuiltin(t, c, "kfold", "partition", map[string]any{"k": 1})
	wantDiag(t, err, diag.StarlarkRuntime)
	items := mustBuiltin(t, c, "items", "partition", map[string]any{"items": []any{map[string]any{"a": 1}, "x"}})
	if !reflect.DeepEqual(items, []any{map[string]any{"a": int64(1)}, map[string]any{"item": "x"}}) {
		t.Errorf("items = %v", items)
	}
}

func TestReducers(t *testing.T) {
	c := builtins(t)
	metrics := rows(
		map[string]any{"loss": 0.5, "acc": 0.7},
		map[string]any{"loss": 0.25, "acc": 0.9},
		map[string]any{"loss": 0.25, "acc": 0.8},
	)
	col := mustBuiltin(t, c, "collect", "reduce", metrics, map[string]any{"metric": "loss", "goal": "min"}).(map[string]any)
	if len(col["rows"].([]any)) != 3 {
		t.Errorf("collect rows %v", col["rows"])
	}
	if best := col["best"].(map[string]any); best["index"] != int64(1) {
		t.Errorf("collect best %v (ties go to the lowest index)", best)
	}
	if _, ok := mustBuiltin(t, c, "collect", "reduce", metrics, nil).(map[string]any)["best"]; ok {
		t.Error("collect without a metric reports a best row")
	}
	if v := mustBuiltin(t, c, "argmax", "reduce", metrics, map[string]any{"metric": "acc"}).(map[string]any); v["index"] != int64(1) {
		t.Errorf("argmax %v", v)
	}
	if v := mustBuiltin(t, c, "argmin", "reduce", metrics, map[string]any{"metric": "loss"}).(map[string]any); v["index"] != int64(1) {
		t.Errorf("argmin %v", v)
	}
	_, err := callBuiltin(t, c, "argmin", "reduce", metrics, map[string]any{"metric": "auc"})
	d := wantDiag(t, err, diag.StarlarkRuntime)
	if d.Pos.File != "builtin/select.star" {
		t.Errorf("error in a loaded library should point into it: %v", d.Error())
	}

	if v := mustBuiltin(t, c, "sum", "reduce", rows(int64(1), int64(2), int64(3)), nil); v != int64(6) {
		t.Errorf("sum of ints = %#v", v)
	}
	v := mustBuiltin(t, c, "sum", "reduce", rows(
		map[string]any{"n": int64(1), "w": []any{1.0, 2.0}},
		map[string]any{"n": int64(2), "w": []float64{3, 4}},
	), nil)
	if !reflect.DeepEqual(v, map[string]any{"n": int64(3), "w": []float64{4, 6}}) {
		t.Errorf("sum of dicts = %#v", v)
	}
	_, err = callBuiltin(t, c, "sum", "reduce", rows([]any{1.0}, []any{1.0, 2.0}), nil)
	d = wantDiag(t, err, diag.StarlarkRuntime)
	if !strings.Contains(d.Message, "vectors of length 1 and 2") {
		t.Errorf("sum shape error %q", d.Message)
	}
	if v := mustBuiltin(t, c, "mean", "reduce", rows(1.0, 2.0, int64(6)), nil); v != 3.0 {
		t.Errorf("mean = %v", v)
	}
	v = mustBuiltin(t, c, "mean", "reduce", rows(
		map[string]any{"pi": 3.0, "samples": int64(1)},
		map[string]any{"pi": 3.2, "samples": int64(3)},
	), map[string]any{"weight": "samples"})
	if m := v.(map[string]any); math.Abs(m["pi"].(float64)-3.15) > 1e-12 || m["samples"] != int64(4) {
		t.Errorf("weighted mean = %v", v)
	}
	h := mustBuiltin(t, c, "histogram", "reduce", rows(
		map[string]any{"edges": []any{0.0, 1.0, 2.0}, "counts": []any{int64(1), int64(2)}, "outside": int64(1)},
		map[string]any{"edges": []any{0.0, 1.0, 2.0}, "counts": []any{int64(3), int64(4)}},
	), nil)
	if !reflect.DeepEqual(h, map[string]any{"edges": []any{0.0, 1.0, 2.0}, "counts": []any{int64(4), int64(6)}, "outside": int64(1)}) {
		t.Errorf("histogram = %v", h)
	}
	_, err = callBuiltin(t, c, "histogram", "reduce", rows(
		map[string]any{"edges": []any{0.0, 1.0}, "counts": []any{int64(1)}},
		map[string]any{"edges": []any{0.0, 2.0}, "counts": []any{int64(1)}},
	), nil)
	wantDiag(t, err, diag.StarlarkRuntime)
	cat := mustBuiltin(t, c, "concat", "reduce", rows([]any{int64(1), int64(2)}, "x", []any{int64(3)}), nil)
	if !reflect.DeepEqual(cat, []any{int64(1), int64(2), "x", int64(3)}) {
		t.Errorf("concat = %v", cat)
	}
}

func TestMonteCarloPi(t *testing.T) {
	c := builtins(t)
	out := pipeline(t, c, "range", map[string]any{"count": 2_000_000, "chunks": 4},
		"montecarlo-pi", nil, nil, "mean", map[string]any{"weight": "samples"}).(map[string]any)
	if pi := out["pi"].(float64); math.Abs(pi-math.Pi) > 0.01 || out["samples"] != int64(2_000_000) {
		t.Fatalf("pi estimate %v from %v samples", pi, out["samples"])
	}
	again := pipeline(t, c, "range", map[string]any{"count": 2_000_000, "chunks": 4},
		"montecarlo-pi", nil, nil, "mean", map[string]any{"weight": "samples"})
	if !reflect.DeepEqual(out, again) {
		t.Fatal("montecarlo-pi is not deterministic")
	}
	if cost := mustBuiltin(t, c, "montecarlo-pi", "cost", map[string]any{"count": 1_000_000}); cost != int64(10) {
		t.Fatalf("cost = %v", cost)
	}
}

func TestMatMulBlocks(t *testing.T) {
	c := builtins(t)
	n := 30
	got := pipeline(t, c, "range", map[string]any{"count": n, "chunks": 4},
		"matmul", map[string]any{"n": n, "seed": 5}, nil, "concat", nil).([]any)
	whole := mustBuiltin(t, c, "matmul", "run", map[string]any{"n": n, "seed": 5}, nil).([][]float64)
	if len(got) != n {
		t.Fatalf("%d rows, want %d", len(got), n)
	}
	for i := range got {
		if !tensor.Equal(got[i].([]float64), whole[i]) {
			t.Fatalf("row %d of the assembled blocks differs from the whole product", i)
		}
	}
	// Against a product computed here from the same generator.
	g := newGenerator(streamKey(5), "")
	a, b := make([]float64, n*n), make([]float64, n*n)
	for i := range a {
		a[i] = g.r.NormFloat64()
	}
	for i := range b {
		b[i] = g.r.NormFloat64()
	}
	want, _ := tensor.MatMul(&tensor.Matrix{Rows: n, Cols: n, Data: a}, &tensor.Matrix{Rows: n, Cols: n, Data: b})
	if !tensor.Equal(want.Row(7), whole[7]) {
		t.Fatal("matmul differs from the product of rng.stream(seed)'s matrices")
	}
}

// separable returns a binary dataset whose label is a noisy linear function
// of three features.
func separable(n int, seed uint64) *model.Dataset {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float64, n*3)
	y := make([]float64, n)
	for i := range n {
		s := 0.0
		for j, w := range []float64{2, -1, 0.5} {
			v := r.NormFloat64()*3 + 10
			x[i*3+j] = v
			s += w * (v - 10)
		}
		if s+r.NormFloat64()*0.3 > 0 {
			y[i] = 1
		}
	}
	return &model.Dataset{Name: "sep", Features: []string{"a", "b", "c"}, Label: "y", X: mat.NewDense(n, 3, x), Y: y}
}

func TestTrainEval(t *testing.T) {
	c := builtins(t)
	ds := separable(400, 1)
	inputs := map[string]any{"data": ds}
	params := map[string]any{"model": "logistic", "epochs": 10, "lr": 0.1, "seed": 3}
	v := mustBuiltin(t, c, "train-eval", "run", params, inputs).(map[string]any)
	if v["accuracy"].(float64) < 0.9 || v["auc"].(float64) < 0.95 || v["n"] != int64(80) {
		t.Fatalf("holdout metrics %v", v)
	}
	for _, k := range []string{"loss", "log_loss", "correct", "train_loss"} {
		if _, ok := v[k]; !ok {
			t.Errorf("metrics lack %s: %v", k, v)
		}
	}
	if again := mustBuiltin(t, c, "train-eval", "run", params, inputs); !reflect.DeepEqual(v, again) {
		t.Fatal("train-eval is not deterministic")
	}
	// k-fold: every row is evaluated exactly once across the folds.
	out := pipeline(t, c, "kfold", map[string]any{"k": 4}, "train-eval", map[string]any{"model": "mlp", "hidden": 4, "epochs": 5, "optimizer": "adamw", "lr": 0.01},
		inputs, "collect", map[string]any{"metric": "accuracy", "goal": "max"}).(map[string]any)
	total := int64(0)
	for _, r := range out["rows"].([]any) {
		total += r.(map[string]any)["value"].(map[string]any)["n"].(int64)
	}
	if total != 400 {
		t.Fatalf("folds evaluated %d rows, want 400", total)
	}
	// Linear regression reports rmse.
	lin := mustBuiltin(t, c, "train-eval", "run", map[string]any{"model": "linear", "epochs": 5, "lr": 0.01}, inputs).(map[string]any)
	if _, ok := lin["rmse"]; !ok {
		t.Fatalf("linear metrics %v", lin)
	}
	// Bad hyper-parameters are diagnostics at the content line.
	_, err := callBuiltin(t, c, "train-eval", "run", map[string]any{"lr": -1.0}, inputs)
	d := wantDiag(t, err, diag.NativeArgument)
	if d.Pos == nil || d.Pos.File != "builtin/train-eval.star" || !strings.Contains(d.Message, "learning rate") {
		t.Fatalf("bad lr: %v", d.Error())
	}
	_, err = callBuiltin(t, c, "train-eval", "run", map[string]any{"k": 500, "fold": 0}, inputs)
	wantDiag(t, err, diag.DatasetTooSmall)
	_, err = callBuiltin(t, c, "train-eval", "run", params, map[string]any{})
	wantDiag(t, err, diag.StarlarkRuntime)
}

func TestDataModelBindings(t *testing.T) {
	ds := separable(100, 2)
	got, err := run(t, `
def run(p, i):
    ds = i["data"]
    tr, te = data.split(ds, 0.25, 1)
    tr, te = data.standardize(tr, te)
    m = model.train(kind="logistic", data=tr, epochs=3, seed=1)
    return {"rows": data.rows(ds), "dims": data.dims(ds), "attrs": [ds.rows, ds.dims, ds.label, ds.features],
            "split": [tr.rows, te.rows], "classes": data.classes(ds), "size": len(model.params(m)),
            "kind": m.kind, "predict": len(model.predict(m, [0, 0, 0]))}
`, "run", nil, map[string]any{"data": ds})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"rows": int64(100), "dims": int64(3), "attrs": []any{int64(100), int64(3), "y", []any{"a", "b", "c"}},
		"split": []any{int64(75), int64(25)}, "classes": []any{0.0, 1.0}, "size": int64(4), "kind": "logistic", "predict": int64(1)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	_, err = run(t, "def run(p, i):\n    return i[\"data\"]\n", "run", nil, map[string]any{"data": ds})
	wantDiag(t, err, diag.ContentShape)
	_, err = run(t, "def run(p, i):\n    return data.rows([1])\n", "run", nil, nil)
	wantDiag(t, err, diag.NativeArgument)
}

// TestEnsembleReducer: two binary members and a single model on three
// rows. The ensemble's probabilities are the members' mean, scored by log
// loss and accuracy; a member scored on other rows is refused.
func TestEnsembleReducer(t *testing.T) {
	c := builtins(t)
	labels := []any{1.0, 0.0, 1.0}
	member := func(p ...float64) map[string]any {
		outs := make([]any, len(p))
		for i, v := range p {
			outs[i] = []any{v}
		}
		return map[string]any{"outputs": outs, "labels": labels}
	}
	single := member(0.9, 0.1, 0.9)
	single["role"] = "single"
	got := mustBuiltin(t, c, "ensemble", "reduce", rows(member(0.8, 0.6, 0.2), member(0.4, 0.2, 0.6), single), nil).(map[string]any)
	ens := got["ensemble"].(map[string]any)
	// Averaged: 0.6, 0.4, 0.4 — right, right, wrong.
	wantLoss := -(math.Log(0.6) + math.Log(0.6) + math.Log(0.4)) / 3
	if math.Abs(ens["log_loss"].(float64)-wantLoss) > 1e-12 || ens["accuracy"].(float64) != 2.0/3 {
		t.Errorf("ensemble = %v, want log_loss %v, accuracy 2/3", ens, wantLoss)
	}
	if got["k"] != int64(2) || got["n"] != int64(3) {
		t.Errorf("k, n = %v, %v; want 2, 3", got["k"], got["n"])
	}
	if s := got["single"].(map[string]any); s["index"] != int64(2) || s["accuracy"].(float64) != 1 {
		t.Errorf("single = %v, want shard 2 with accuracy 1", s)
	}
	// Log loss is convex: the ensemble's is never above the members' mean.
	if mean := got["member_mean"].(map[string]any)["log_loss"].(float64); ens["log_loss"].(float64) > mean {
		t.Errorf("ensemble log loss %v above the members' mean %v", ens["log_loss"], mean)
	}
	other := member(0.5, 0.5, 0.5)
	other["labels"] = []any{0.0, 0.0, 1.0}
	if _, err := callBuiltin(t, c, "ensemble", "reduce", rows(member(0.8, 0.6, 0.2), other), nil); err == nil || !strings.Contains(err.Error(), "other rows") {
		t.Errorf("members on other rows: err = %v, want a refusal naming other rows", err)
	}
}
