package script

import (
	"context"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// standardized returns separable data standardised, ready for SGD.
func standardized(n int, seed uint64) *model.Dataset {
	d := separable(n, seed)
	return model.FitStandardizer(d).Apply(d)
}

func vec(t *testing.T, v any) []float64 {
	t.Helper()
	f, ok := v.([]float64)
	if !ok {
		t.Fatalf("got %T, want a vector", v)
	}
	return f
}

// model.train from a given parameter vector, with FedProx's proximal term
// and SCAFFOLD's correction, is exactly model.Train with those options.
func TestTrainFromInitMatchesGo(t *testing.T) {
	ds := standardized(300, 3)
	init := []float64{0.3, -0.2, 0.1, 0.05}
	anchor := []float64{0.1, 0.1, 0.1, 0.1}
	corr := []float64{0.01, -0.02, 0.03, 0}
	src := `
def run(params, inputs):
    m = model.train(kind="logistic", data=inputs["d"], init=params["init"], epochs=3, batch_size=16, lr=0.05,
                    mu=0.5, anchor=params["anchor"], correction=params["corr"], seed=9)
    return {"w": model.params(m), "steps": m.steps, "examples": m.examples}
`
	res, err := run(t, src, "run", map[string]any{"init": init, "anchor": anchor, "corr": corr}, map[string]any{"d": ds})
	if err != nil {
		t.Fatal(err)
	}
	got := res.(map[string]any)
	m := &model.Model{Spec: model.Spec{Kind: model.KindLogistic, Inputs: 3}, Params: slices.Clone(init)}
	stats, err := model.Train(m, ds, model.TrainConfig{Epochs: 3, BatchSize: 16, LR: 0.05, Mu: 0.5, Anchor: anchor, Correction: corr, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vec(t, got["w"]), m.Params) {
		t.Fatalf("content trained %v, Go %v", got["w"], m.Params)
	}
	if got["steps"] != int64(stats.Steps) || got["examples"] != int64(stats.Examples) {
		t.Fatalf("steps %v examples %v, want %d %d", got["steps"], got["examples"], stats.Steps, stats.Examples)
	}
	if init[0] != 0.3 {
		t.Fatal("model.train wrote into the init vector the engine lent")
	}
}

// AdamW's state goes out with model.adam_state and back in with adam_state,
// through plain values (as a silo persists it), and continues the run.
func TestTrainAdamStateCarries(t *testing.T) {
	ds := standardized(200, 4)
	src := `
def run(params, inputs):
    d = inputs["d"]
    a = model.train(kind="logistic", data=d, optimizer="adamw", steps=5, lr=0.01, seed=1)
    sa = model.adam_state(a)
    b = model.train(kind="logistic", data=d, optimizer="adamw", steps=5, lr=0.01, seed=1,
                    init=model.params(a), adam_state=sa)
    sb = model.adam_state(b)
    sgd = model.train(kind="logistic", data=d, steps=5, seed=1)
    return {"ta": sa["t"], "tb": sb["t"], "ma": sa["m"], "mb": sb["m"], "sgd": model.adam_state(sgd), "wb": model.params(b)}
`
	res, err := run(t, src, "run", map[string]any{}, map[string]any{"d": ds})
	if err != nil {
		t.Fatal(err)
	}
	got := res.(map[string]any)
	if got["ta"] != int64(5) || got["tb"] != int64(10) || got["sgd"] != nil {
		t.Fatalf("adam steps %v then %v, sgd state %v", got["ta"], got["tb"], got["sgd"])
	}
	if slices.Equal(vec(t, got["ma"]), vec(t, got["mb"])) {
		t.Fatal("the second run did not update the moments")
	}
	// The same continuation in Go.
	m, _ := model.New(model.Spec{Kind: model.KindLogistic, Inputs: 3}, 1)
	st := &model.AdamState{}
	cfg := model.TrainConfig{Optimizer: model.OptAdamW, Steps: 5, LR: 0.01, Seed: 1, Adam: st}
	for range 2 {
		if _, err := model.Train(m, ds, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(m.Params, vec(t, got["wb"])) {
		t.Fatalf("content %v, Go %v", got["wb"], m.Params)
	}
}

func TestParamsNatives(t *testing.T) {
	ds := standardized(120, 5)
	src := `
def run(params, inputs):
    d = inputs["d"]
    m = model.train(kind="logistic", data=d, epochs=2, seed=3)
    w = model.params(m)
    z = model.init_params(kind="softmax", inputs=3, classes=4)
    h = model.init_params(kind="mlp", inputs=3, classes=2, hidden=5, seed=7)
    s = model.train(kind="softmax", data=d, init=z, epochs=1)   # classes from the length of init
    f = model.from_params("logistic", w, 3)
    return {"direct": model.evaluate(m, d), "by_params": model.evaluate_params("logistic", w, d),
            "from": model.evaluate(f, d), "zlen": len(z), "zsum": tensor.norm(z), "hlen": len(h),
            "hnorm": tensor.norm(h), "sclasses": s.classes, "fsteps": f.steps}
`
	res, err := run(t, src, "run", map[string]any{}, map[string]any{"d": ds})
	if err != nil {
		t.Fatal(err)
	}
	got := res.(map[string]any)
	direct := got["direct"].(map[string]any)
	for _, k := range []string{"by_params", "from"} {
		other := got[k].(map[string]any)
		for mk, v := range direct {
			if other[mk] != v {
				t.Errorf("%s[%s] = %v, evaluate gives %v", k, mk, other[mk], v)
			}
		}
	}
	if got["zlen"] != int64(16) || got["zsum"] != 0.0 || got["hlen"] != int64(5*3+5+5+1) || got["hnorm"] == 0.0 {
		t.Errorf("init_params: %v", got)
	}
	if got["sclasses"] != int64(4) || got["fsteps"] != int64(0) {
		t.Errorf("softmax from init has %v classes, from_params %v steps", got["sclasses"], got["fsteps"])
	}
}

func TestTrainArgumentErrors(t *testing.T) {
	ds := standardized(60, 6)
	for _, tc := range []struct{ name, call string }{
		{"init length", `model.train(data=d, init=[0.0, 1.0])`},
		{"mu without anchor", `model.train(data=d, mu=1.0)`},
		{"anchor length", `model.train(data=d, mu=1.0, anchor=[0.0])`},
		{"adam state with sgd", `model.train(data=d, adam_state={"m": [0.0]*4, "v": [0.0]*4, "t": 1})`},
		{"adam state shape", `model.train(data=d, optimizer="adamw", adam_state={"m": [0.0]*3, "v": [0.0]*4, "t": 1})`},
		{"dp switch", `model.train(data=d, dp=None)`},
		{"evaluate_params length", `model.evaluate_params("logistic", [1.0, 2.0], d)`},
		{"from_params mlp ambiguous", `model.from_params("mlp", [0.0]*26, 3, hidden=5)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "def run(params, inputs):\n    d = inputs[\"d\"]\n    return " + tc.call + "\n"
			_, err := run(t, src, "run", map[string]any{}, map[string]any{"d": ds})
			wantDiag(t, err, diag.NativeArgument)
		})
	}
}

// trainTwice is content that trains without a word about DP.
const trainTwice = `
def run(params, inputs):
    d = inputs["d"]
    a = model.train(kind="logistic", data=d, epochs=2, batch_size=8, lr=0.1, seed=1)
    b = model.train(kind="logistic", data=d, epochs=2, batch_size=8, lr=0.1, seed=1)
    return {"a": model.params(a), "b": model.params(b), "sa": a.steps, "sb": b.steps}
`

// The engine's training policy turns every model.train into DP-SGD, though
// the content passes no DP option and cannot pass one.
func TestTrainingPolicyImposesDP(t *testing.T) {
	ds := standardized(200, 7)
	e := entry(t, "plain.star", trainTwice)
	inputs := map[string]any{"d": ds}

	// Without a policy: deterministic, and no run is DP.
	res, err := Call(context.Background(), Env{}, e, "run", map[string]any{}, inputs)
	if err != nil {
		t.Fatal(err)
	}
	plain := res.(map[string]any)
	if !slices.Equal(vec(t, plain["a"]), vec(t, plain["b"])) {
		t.Fatal("without DP two runs with one seed differ")
	}

	var runs []TrainRun
	policy := &TrainingPolicy{
		DP:      &model.DPSGD{Q: 0.1, Clip: 1, Sigma: 1.5},
		Trained: func(r TrainRun) { runs = append(runs, r) },
	}
	res, err = Call(context.Background(), Env{Training: policy}, e, "run", map[string]any{}, inputs)
	if err != nil {
		t.Fatal(err)
	}
	priv := res.(map[string]any)
	if len(runs) != 2 {
		t.Fatalf("%d runs reported, want 2", len(runs))
	}
	for _, r := range runs {
		if r.DP == nil || r.DP.Q != 0.1 || r.DP.Sigma != 1.5 || r.DP.Clip != 1 || r.Steps != 20 || r.DP.Steps != 20 || r.Rows != 200 {
			t.Fatalf("run %+v (DP %+v): want DP-SGD with the policy's q, σ, clip and 2 epochs·round(1/q) = 20 steps", r, r.DP)
		}
	}
	if priv["sa"] != int64(20) {
		t.Fatalf("m.steps = %v under DP, want 20", priv["sa"])
	}
	if slices.Equal(vec(t, priv["a"]), vec(t, priv["b"])) || slices.Equal(vec(t, priv["a"]), vec(t, plain["a"])) {
		t.Fatal("under the DP policy training is still deterministic: DP-SGD did not run")
	}

	// The allowance caps the steps of all runs of one call together.
	runs = nil
	policy.DP.Steps = 25
	_, err = Call(context.Background(), Env{Training: policy}, e, "run", map[string]any{}, inputs)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Steps != 20 || runs[1].Steps != 5 {
		t.Fatalf("runs %+v: want 20 then the 5 steps left", runs)
	}
	policy.DP.Steps = 20
	_, err = Call(context.Background(), Env{Training: policy}, e, "run", map[string]any{}, inputs)
	wantDiag(t, err, diag.FLDPSteps)
}
