package fl

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

func wantDiag(t *testing.T, err error, code diag.Code) *diag.Diagnostic {
	t.Helper()
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("got %v, want diagnostic %s", err, code)
	}
	if ds[0].Code != code {
		t.Fatalf("got %s, want %s", ds[0].Error(), code)
	}
	return ds[0]
}

var recordDP = Privacy{Unit: UnitRecord, SampleRate: 0.05, Clip: 1, Sigma: 1.1}

// Under record-level DP, model.train inside the content runs DP-SGD although
// the built-in strategy passes no DP option: the ledger is told the exact
// mechanism, and training stops being deterministic.
func TestRecordLevelDPImposedOnContent(t *testing.T) {
	c := builtins(t)
	env := script.Env{Catalog: c}
	ctx := context.Background()
	train, _, _ := hospitalSplits(t, 1, 400, 10)
	d := train[0]
	s := load(t, c, "fedavg", map[string]any{"epochs": int64(2), "lr": 0.1})
	g, err := Init(ctx, env, s, d.Dims())
	if err != nil {
		t.Fatal(err)
	}
	plainA, err := ClientStep(ctx, env, s, g, d, nil, Privacy{})
	if err != nil {
		t.Fatal(err)
	}
	plainB, _ := ClientStep(ctx, env, s, g, d, nil, Privacy{})
	if !slices.Equal(plainA.Update, plainB.Update) || len(plainA.Mechanism.Mechanisms) != 0 || plainA.Mechanism.Unit != UnitNone {
		t.Fatalf("without DP: updates differ or a mechanism %+v is reported", plainA.Mechanism)
	}

	// The caller's env may even carry a permissive policy: ClientStep
	// replaces it with the one privacy implies.
	env.Training = &script.TrainingPolicy{}
	privA, err := ClientStep(ctx, env, s, g, d, nil, recordDP)
	if err != nil {
		t.Fatal(err)
	}
	privB, _ := ClientStep(ctx, env, s, g, d, nil, recordDP)
	want := []dp.Mechanism{dp.SubsampledGaussian(1.1, 0.05, 2*20)}
	if privA.Mechanism.Unit != UnitRecord || privA.Mechanism.Clip != 1 || !slices.Equal(privA.Mechanism.Mechanisms, want) {
		t.Fatalf("mechanism %+v, want record-level %v (2 epochs · 1/q steps)", privA.Mechanism, want)
	}
	if slices.Equal(privA.Update, privB.Update) || slices.Equal(privA.Update, plainA.Update) {
		t.Fatal("under record-level DP the update is deterministic: DP-SGD did not run")
	}

	// A strategy that trains twice is charged for both runs, within the
	// allowance; past it, it is refused.
	greedy := load(t, c, "testdata/greedy.star", nil)
	gg, err := Init(ctx, env, greedy, d.Dims())
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := gg.Vector("w"); !ok || len(w) != 10 || gg["round"] != int64(0) {
		t.Fatalf("default init %v", gg)
	}
	out, err := ClientStep(ctx, env, greedy, gg, d, nil, recordDP)
	if err != nil {
		t.Fatal(err)
	}
	if m := out.Mechanism.Mechanisms; len(m) != 1 || m[0].Steps != 40 || out.Metrics["steps"] != 40 {
		t.Fatalf("two DP-SGD runs of 20 steps charged as %v (metrics %v)", m, out.Metrics)
	}
	capped := recordDP
	capped.Steps = 30
	out, err = ClientStep(ctx, env, greedy, gg, d, nil, capped)
	if err != nil {
		t.Fatal(err)
	}
	if m := out.Mechanism.Mechanisms; m[0].Steps != 30 {
		t.Fatalf("allowance 30, charged %v", m)
	}
	capped.Steps = 20
	_, err = ClientStep(ctx, env, greedy, gg, d, nil, capped)
	wantDiag(t, err, diag.FLDPSteps)

	// An update no DP-SGD run stands behind is refused.
	untrained := load(t, c, "testdata/untrained.star", nil)
	_, err = ClientStep(ctx, env, untrained, Global{}, d, nil, recordDP)
	wantDiag(t, err, diag.FLUnprotected)
	if _, err := ClientStep(ctx, env, untrained, Global{}, d, nil, Privacy{}); err != nil {
		t.Fatalf("without DP the same strategy is refused: %v", err)
	}
}

// Content cannot switch record-level DP off: model.train has no argument
// for it, so an attempt is an error, not a silent non-private run.
func TestRecordLevelDPCannotBeSwitchedOff(t *testing.T) {
	c := builtins(t)
	train, _, _ := hospitalSplits(t, 1, 100, 11)
	for _, attempt := range []string{`dp = None`, `dp_sgd = False`, `sigma = 0.0`, `noise_multiplier = 0.0`, `privacy = "none"`} {
		src := `
def client_step(g, data, params, state):
    m = model.train(kind = "logistic", data = data, epochs = 1, ` + attempt + `)
    return {"update": model.params(m), "weight": 1, "metrics": {}, "state": None}

def server_step(g, total, weight, params):
    return g
`
		e, err := catalog.Parse("sneaky.star", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewStrategy(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ClientStep(context.Background(), script.Env{Catalog: c}, s, Global{}, train[0], nil, recordDP)
		d := wantDiag(t, err, diag.NativeArgument)
		if d.Pos == nil || d.Pos.File != "sneaky.star" || d.Pos.Line != 3 {
			t.Fatalf("%s: diagnostic not at the call: %s", attempt, d.Error())
		}
	}
}

// Update-level DP (unit silo): the engine clips the whole update to C and
// adds N(0, σ²C²) noise after client_step, and reports one Gaussian step.
func TestUpdateLevelDP(t *testing.T) {
	c := builtins(t)
	env := script.Env{Catalog: c}
	ctx := context.Background()
	train, _, _ := hospitalSplits(t, 1, 300, 12)
	s := load(t, c, "fedavg", map[string]any{"epochs": int64(1)})
	g, _ := Init(ctx, env, s, train[0].Dims())
	plain, err := ClientStep(ctx, env, s, g, train[0], nil, Privacy{})
	if err != nil {
		t.Fatal(err)
	}
	if dp.L2Norm(plain.Update) < 1 {
		t.Fatalf("unclipped update norm %v: the test needs one above the clip", dp.L2Norm(plain.Update))
	}
	// A negligible σ shows the clip (on the grid: rounding and N_Z(0, 1)
	// noise move each coordinate by a few grid units, 2^-f each); a large
	// one the noise. Under DP the weight is 1 (weighting uniform).
	tiny := Privacy{Unit: UnitSilo, Clip: 0.1, Sigma: 1e-12}
	out, err := ClientStep(ctx, env, s, g, train[0], nil, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if n := dp.L2Norm(out.Update); math.Abs(n-0.1) > 0.005 {
		t.Fatalf("update norm %v after clipping to 0.1", n)
	}
	if out.Weight != 1 || len(out.Encoded) != len(out.Update) || out.GridBits != dp.GridFracBits(0.1, len(out.Update)) {
		t.Fatalf("weight %v, %d encoded values on grid 2^%d", out.Weight, len(out.Encoded), out.GridBits)
	}
	for i, y := range out.Encoded {
		if out.Update[i] != math.Ldexp(float64(y), -out.GridBits) {
			t.Fatalf("update[%d] = %v is not the decoded release %d·2^-%d", i, out.Update[i], y, out.GridBits)
		}
	}
	want := []dp.Mechanism{dp.SubsampledGaussian(1e-12, 1, 1)}
	if out.Mechanism.Unit != UnitSilo || out.Mechanism.Clip != 0.1 || !slices.Equal(out.Mechanism.Mechanisms, want) {
		t.Fatalf("mechanism %+v", out.Mechanism)
	}
	noisy, err := ClientStep(ctx, env, s, g, train[0], nil, Privacy{Unit: UnitSilo, Clip: 0.5, Sigma: 4, SampleRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := dp.L2Norm(noisy.Update); n < 2 {
		t.Fatalf("update norm %v: noise of σC = 2 per coordinate is missing", n)
	}
	if !slices.Equal(noisy.Mechanism.Mechanisms, []dp.Mechanism{dp.SubsampledGaussian(4, 1, 1)}) {
		t.Fatalf("a silo-level round is the plain Gaussian, q = 1: %+v", noisy.Mechanism)
	}
	// A site that declines releases nothing and is charged nothing.
	declined, err := ClientStep(ctx, env, s.With(map[string]any{"work": 0.5}), g, train[0], nil, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if declined.Update != nil || declined.Weight != 0 || len(declined.Mechanism.Mechanisms) != 0 {
		t.Fatalf("declined step %+v", declined)
	}
	for _, bad := range []Privacy{
		{Unit: UnitSilo, Clip: 0, Sigma: 1},
		{Unit: UnitSilo, Clip: 1, Sigma: 0},
		{Unit: UnitRecord, SampleRate: 0, Clip: 1, Sigma: 1},
		{Unit: UnitRecord, SampleRate: 1.5, Clip: 1, Sigma: 1},
		{Unit: UnitRecord, SampleRate: 0.1, Clip: math.Inf(1), Sigma: 1},
		{Unit: UnitSilo, SampleRate: 1e-6, Clip: 1, Sigma: 1}, // no sampling happens: q < 1 would undercharge
		{Unit: UnitSilo, SampleRate: 0.5, Clip: 1, Sigma: 1},
		{Unit: UnitSilo, Participation: 0.5, Clip: 1, Sigma: 1}, // secret participation is not implemented
		{Unit: "dataset", Clip: 1, Sigma: 1},
	} {
		_, err := ClientStep(ctx, env, s, g, train[0], nil, bad)
		wantDiag(t, err, diag.FLBadPrivacy)
	}
}

// The server step gets the elementwise sum of the round's updates and the
// total weight — exactly those, and nothing about any one site.
func TestServerSeesOnlySums(t *testing.T) {
	c := builtins(t)
	sites, _, _ := hospitalSplits(t, 3, 100, 13)
	sites[1] = sites[1].Subset([]int{0, 1, 2, 3, 4})
	s := load(t, c, "testdata/spy.star", map[string]any{"x": int64(1)})
	h := simulate(t, c, s, sites, 2, SimOptions{Seed: 1})
	seen := h.Final["seen"].([]any)
	if len(seen) != 2 {
		t.Fatalf("server steps seen: %v", seen)
	}
	var want []float64
	var weight float64
	for _, d := range sites {
		n := float64(d.Rows())
		if want == nil {
			want = make([]float64, 3)
		}
		want[0] += n
		want[1] += n * n
		want[2]++
		weight += n
	}
	for _, v := range seen {
		got := v.(map[string]any)
		if !slices.Equal(got["sum"].([]float64), want) || got["weight"] != weight || got["type"] != "vector" {
			t.Fatalf("server step saw %v, want the sum %v and weight %v", got, want, weight)
		}
		for _, k := range got["params"].([]any) {
			if !slices.Contains([]any{"round", "sites", "x"}, k) {
				t.Fatalf("server step params hold %q: %v", k, got["params"])
			}
		}
	}

	// A strategy that expects the individual updates finds only a sum.
	peek := load(t, c, "testdata/peek.star", nil)
	_, err := Simulate(context.Background(), peek, sites, 1, SimOptions{Env: script.Env{Catalog: c}})
	d := wantDiag(t, err, diag.StarlarkRuntime)
	if d.Pos == nil || d.Pos.File != "testdata/peek.star" || d.Pos.Line != 12 {
		t.Fatalf("diagnostic %s", d.Error())
	}
}

func TestContractViolations(t *testing.T) {
	c := builtins(t)
	train, _, _ := hospitalSplits(t, 3, 60, 14)
	for _, tc := range []struct {
		name, ret string
	}{
		{"not a dict", `[1.0]`},
		{"unknown key", `{"update": [1.0], "weight": 1, "metrics": {}, "state": None, "extra": 1}`},
		{"string update", `{"update": "w", "weight": 1}`},
		{"negative weight", `{"update": [1.0], "weight": -1}`},
		{"weight without update", `{"update": None, "weight": 2}`},
		{"metric not a number", `{"update": [1.0], "weight": 1, "metrics": {"auc": "high"}}`},
		{"state not a dict", `{"update": [1.0], "weight": 1, "state": [1]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "def client_step(g, data, params, state):\n    return " + tc.ret + "\n\ndef server_step(g, total, weight, params):\n    return g\n"
			e, err := catalog.Parse("bad.star", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			s, _ := NewStrategy(e, nil)
			_, err = ClientStep(context.Background(), script.Env{Catalog: c}, s, Global{}, train[0], nil, Privacy{})
			d := wantDiag(t, err, diag.FLContract)
			if d.Pos == nil || d.Pos.Line != 1 {
				t.Fatalf("not positioned at client_step: %s", d.Error())
			}
		})
	}

	// Updates of different lengths in one round.
	src := "def client_step(g, data, params, state):\n    return {\"update\": [1.0] * (data.rows % 3 + 1), \"weight\": 1}\n\ndef server_step(g, total, weight, params):\n    return g\n"
	e, _ := catalog.Parse("ragged.star", []byte(src))
	s, _ := NewStrategy(e, nil)
	sites := []*model.Dataset{train[0].Subset([]int{0}), train[1].Subset([]int{0, 1})}
	_, err := Simulate(context.Background(), s, sites, 1, SimOptions{Env: script.Env{Catalog: c}})
	wantDiag(t, err, diag.FLDimension)

	// A server step that returns no dict.
	src = "def client_step(g, data, params, state):\n    return {\"update\": [1.0], \"weight\": 1}\n\ndef server_step(g, total, weight, params):\n    return total\n"
	e, _ = catalog.Parse("vec.star", []byte(src))
	s, _ = NewStrategy(e, nil)
	_, err = Simulate(context.Background(), s, sites, 1, SimOptions{Env: script.Env{Catalog: c}})
	d := wantDiag(t, err, diag.FLContract)
	if d.Pos == nil || d.Pos.Line != 4 {
		t.Fatalf("not positioned at server_step: %s", d.Error())
	}

	// Only a strategy loads as one.
	_, err = Load(c, "mean", "", nil)
	wantDiag(t, err, diag.ContentKind)
	_, err = Load(c, "fedavgg", "", nil)
	wantDiag(t, err, diag.UnknownContent)

	// Simulation options are checked before anything runs.
	fedavg := load(t, c, "fedavg", nil)
	for _, opts := range []SimOptions{{Stragglers: 1.5}, {Cohort: 9}, {Async: &Async{}}, {Parallel: -1}} {
		opts.Env = script.Env{Catalog: c}
		_, err := Simulate(context.Background(), fedavg, train, 1, opts)
		wantDiag(t, err, diag.FLBadSimulation)
	}
	_, err = Simulate(context.Background(), fedavg, train, 0, SimOptions{Env: script.Env{Catalog: c}})
	wantDiag(t, err, diag.FLBadSimulation)

	// Cancellation stops a simulation.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Simulate(ctx, fedavg, train, 3, SimOptions{Env: script.Env{Catalog: c}})
	if err == nil || !(errors.Is(err, context.Canceled) || diagCode(err) == diag.ContentCancelled) {
		t.Fatalf("cancelled simulation: %v", err)
	}
}

func diagCode(err error) diag.Code {
	if ds, ok := diag.As(err); ok {
		return ds[0].Code
	}
	return ""
}

// The engine clips, noises and decodes an update in place (issue 32): a
// result that also keeps its update in the client state keeps what the
// content returned, not what was released.
func TestReleasedUpdateLeavesTheStateAlone(t *testing.T) {
	src := `
def client_step(g, data, params, state):
    u = tensor.vec([3.0, 4.0, 0.5])
    return {"update": u, "weight": 1, "metrics": {}, "state": {"last": u}}

def server_step(g, total, weight, params):
    return g
`
	e, err := catalog.Parse("keeps.star", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStrategy(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	train, _, _ := hospitalSplits(t, 1, 50, 3)
	out, err := ClientStep(context.Background(), script.Env{Catalog: builtins(t)}, s, Global{}, train[0], nil, Privacy{Unit: UnitSilo, Clip: 1, Sigma: 1})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := asVector(out.State["last"])
	if !slices.Equal(last, []float64{3, 4, 0.5}) {
		t.Fatalf("the state holds %v, want what the content returned", last)
	}
	if slices.Equal(out.Update, last) || len(out.Encoded) != 3 {
		t.Fatalf("the released update %v (encoded %v) is not the noised one", out.Update, out.Encoded)
	}
}
