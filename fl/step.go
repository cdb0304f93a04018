package fl

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

// ClientOutput is what one site's client step produces.
type ClientOutput struct {
	// Update is the one vector summed across sites (already clipped and
	// noised under update-level DP). Nil means the site declined the round
	// (Weight is then 0): under secure aggregation it contributes zeros.
	Update []float64
	// Weight is summed across sites and handed to the server step.
	Weight float64
	// Metrics are summed across sites (never revealed per site): by
	// convention examples, loss (mean loss × examples) and correct, of the
	// incoming global on the site's rows.
	Metrics map[string]float64
	// State is the site's new local state, to persist (EncodeState) and
	// hand to the next client step; nil means none.
	State map[string]any
	// Mechanism is the DP that ran, for the ledger.
	Mechanism Mechanism
	// Encoded is the update as released under DP: on the integer grid of
	// 2^GridBits, with update-level noise added there (dp.GridGaussian)
	// or, at record level, randomly rounded (dp.RoundOnGrid). Update then
	// holds its decoded value. Nil without DP or without an update.
	Encoded  []int64
	GridBits int
}

// Init returns the initial global state: the strategy's init(params, dims),
// or when it defines none {"w": the initial parameters of the model the
// params describe, "round": 0} — zeros for logistic, softmax and linear
// models, model.New's seeded weights for an mlp (params model, classes,
// hidden, init_seed as in fl-common).
func Init(ctx context.Context, env script.Env, s *Strategy, dims int) (Global, error) {
	env.Training = nil
	if !s.Entry.HasFunc("init") {
		return defaultInit(s, dims)
	}
	res, err := script.Call(ctx, env, s.Entry, "init", s.params(), int64(dims))
	if err != nil {
		return nil, err
	}
	g, ok := res.(map[string]any)
	if !ok {
		return nil, contract(s, "init", "returned %s; it must return a dict (the global state)", describe(res))
	}
	return Global(g), nil
}

func defaultInit(s *Strategy, dims int) (Global, error) {
	seed, _ := asNumber(s.Params["init_seed"])
	spec := paramsModelSpec(s.Params, dims)
	m, err := model.New(spec, uint64(seed))
	if err != nil {
		return nil, contract(s, "client_step", "has no init, and the params do not describe a model: %v", err)
	}
	return Global{"w": m.Params, "round": int64(0)}, nil
}

// ClientStep runs the strategy's client_step(global, data, params, state)
// at a site, under privacy. Record-level DP is imposed on every model.train
// the content runs (env.Training is replaced by the policy privacy
// implies); update-level DP clips the returned update to privacy.Clip,
// puts it on the integer grid and adds exact discrete Gaussian noise there
// (dp.GridGaussian), after client_step and before anything leaves. Under
// record-level DP an update that no DP-SGD run stands behind is refused
// (diag.FLUnprotected).
//
// Under DP a site's weight is fixed: the engine sets the param weighting
// to "uniform" and refuses a weight other than 1, so the summed weight is
// the public number of participants and reveals nothing about a site's
// row count (docs/dp.md, "What leaves a silo").
//
// state is the site's persisted client state (nil for none). The returned
// Mechanism says what to charge the ledger before releasing Update.
func ClientStep(ctx context.Context, env script.Env, s *Strategy, global Global, data *model.Dataset, state map[string]any, privacy Privacy) (ClientOutput, error) {
	if err := privacy.Validate(); err != nil {
		return ClientOutput{}, err
	}
	if data == nil {
		return ClientOutput{}, fmt.Errorf("fl: ClientStep without data")
	}
	env.Training = nil
	var dpSteps int
	if privacy.Unit == UnitRecord {
		env.Training = &script.TrainingPolicy{
			DP: &model.DPSGD{Q: privacy.SampleRate, Clip: privacy.Clip, Sigma: privacy.Sigma, Steps: privacy.Steps},
			Trained: func(r script.TrainRun) {
				if r.DP != nil {
					dpSteps += r.Steps
				}
			},
		}
	}
	if privacy.Unit != UnitNone {
		s = s.With(map[string]any{"weighting": "uniform"})
	}
	var stateArg any
	if state != nil {
		stateArg = state
	}
	res, err := script.Call(ctx, env, s.Entry, "client_step", map[string]any(global), data, s.params(), stateArg)
	if err != nil {
		return ClientOutput{}, err
	}
	out, err := parseClientOutput(s, res)
	if err != nil {
		return ClientOutput{}, err
	}
	if privacy.Unit != UnitNone && out.Update != nil && out.Weight != 1 {
		return ClientOutput{}, contract(s, "client_step", "returned weight %v under differential privacy; a site's weight is fixed at 1 (the summed weight is the public participant count)", out.Weight)
	}
	switch privacy.Unit {
	case UnitRecord:
		if out.Update != nil && dpSteps == 0 {
			return ClientOutput{}, diag.New(diag.FLUnprotected, s.Subject(), "client_step returned an update, but trained nothing under DP-SGD").
				At(s.Entry.Path, defLine(s.Entry, "client_step"), 0).
				WithHelp("under record-level DP the update must come from model.train; use update-level DP (unit silo) for strategies that compute updates otherwise")
		}
		if dpSteps > 0 {
			out.Mechanism = Mechanism{Unit: UnitRecord, Clip: privacy.Clip, Mechanisms: privacy.Mechanisms(dpSteps)}
		}
		if out.Update != nil {
			out.GridBits = privacy.grid(len(out.Update))
			if out.Encoded, err = dp.RoundOnGrid(out.Update, out.GridBits, privacy.Noise); err != nil {
				return ClientOutput{}, err
			}
			out.Update = dp.FromGridInto(out.Update, out.Encoded, out.GridBits) // out.Update is the step's own: its values are released
		}
	case UnitSilo:
		if out.Update != nil {
			if err := privacy.releaseUpdate(&out); err != nil {
				return ClientOutput{}, err
			}
		}
	}
	return out, nil
}

// releaseUpdate releases out.Update at the silo level: clipped to Clip,
// on the integer grid, with exact discrete Gaussian noise there
// (dp.GridGaussian); out then holds the encoded release, its decoded value
// and the mechanism to charge.
func (p Privacy) releaseUpdate(out *ClientOutput) error {
	g := p.UpdateMechanism(len(out.Update))
	enc, err := g.Release(out.Update, p.Noise)
	if err != nil {
		return err
	}
	out.Encoded, out.GridBits = enc, g.FracBits
	out.Update = dp.FromGridInto(out.Update, out.Encoded, out.GridBits) // out.Update is the step's own: its values are released
	out.Mechanism = Mechanism{Unit: UnitSilo, Clip: p.Clip, Mechanisms: p.Mechanisms(0)}
	return nil
}

// UpdateMechanism is the grid mechanism a silo-level update of dim values
// is released with: clipped to Clip, on the grid of 2^GridBits (or
// dp.GridFracBits), noised with multiplier Sigma. Its charge is
// Mechanisms(0): one Gaussian release at q = 1.
func (p Privacy) UpdateMechanism(dim int) dp.GridGaussian {
	return dp.GridGaussian{Clip: p.Clip, Sigma: p.Sigma, FracBits: p.grid(dim), Dim: dim}
}

func (p Privacy) grid(dim int) int {
	if p.GridBits > 0 {
		return p.GridBits
	}
	return dp.GridFracBits(p.Clip, dim)
}

var clientKeys = []string{"metrics", "state", "update", "weight"}

func parseClientOutput(s *Strategy, res any) (ClientOutput, error) {
	var out ClientOutput
	m, ok := res.(map[string]any)
	if !ok {
		return out, contract(s, "client_step", "returned %s; it must return a dict with keys %v", describe(res), clientKeys)
	}
	keys := slices.Sorted(maps.Keys(m))
	for _, k := range keys {
		if !slices.Contains(clientKeys, k) {
			return out, contract(s, "client_step", "returned the unknown key %q; the keys are %v", k, clientKeys)
		}
	}
	if u, present := m["update"]; present && u != nil {
		v, ok := asVector(u)
		if !ok {
			return out, contract(s, "client_step", "returned update %s; it must be a vector or None", describe(u))
		}
		if len(v) == 0 {
			return out, contract(s, "client_step", "returned an empty update")
		}
		out.Update = v
	}
	w, ok := asNumber(m["weight"])
	if !ok || !(w >= 0) || math.IsInf(w, 0) {
		return out, contract(s, "client_step", "returned weight %s; it must be a finite number ≥ 0", describe(m["weight"]))
	}
	if out.Update == nil && w != 0 {
		return out, contract(s, "client_step", "returned no update but weight %v; a site that declines the round has weight 0", w)
	}
	out.Weight = w
	if mv := m["metrics"]; mv != nil {
		mm, ok := mv.(map[string]any)
		if !ok {
			return out, contract(s, "client_step", "returned metrics %s; they must be a dict of numbers", describe(mv))
		}
		out.Metrics = make(map[string]float64, len(mm))
		for k, v := range mm {
			f, ok := asNumber(v)
			if !ok {
				return out, contract(s, "client_step", "returned metrics[%q] = %s; metrics are numbers (they are summed)", k, describe(v))
			}
			out.Metrics[k] = f
		}
	}
	if sv := m["state"]; sv != nil {
		st, ok := sv.(map[string]any)
		if !ok {
			return out, contract(s, "client_step", "returned state %s; it must be a dict or None", describe(sv))
		}
		out.State = st
	}
	if out.Update != nil && sharesVector(out.State, out.Update) {
		// The engine clips, noises and decodes the update in place; a state
		// holding the same vector keeps what the content returned.
		out.Update = slices.Clone(out.Update)
	}
	return out, nil
}

// sharesVector reports whether v holds a vector with u's backing array (a
// result that returns one vector under two keys).
func sharesVector(v any, u []float64) bool {
	switch x := v.(type) {
	case []float64:
		return len(x) > 0 && &x[0] == &u[0]
	case map[string]any:
		for _, e := range x {
			if sharesVector(e, u) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if sharesVector(e, u) {
				return true
			}
		}
	}
	return false
}

// ServerStep runs the strategy's server_step(global, sum, total_weight,
// params) and returns the next global state. It receives the elementwise
// sum of the round's updates and the sum of their weights — nothing about
// any one site, which is why every strategy composes with secure
// aggregation. sum is lent to the content, not copied; it is not modified.
func ServerStep(ctx context.Context, env script.Env, s *Strategy, global Global, sum []float64, weight float64) (Global, error) {
	if !(weight >= 0) || math.IsInf(weight, 0) {
		return nil, fmt.Errorf("fl: ServerStep with total weight %v", weight)
	}
	env.Training = nil
	res, err := script.Call(ctx, env, s.Entry, "server_step", map[string]any(global), sum, weight, s.params())
	if err != nil {
		return nil, err
	}
	g, ok := res.(map[string]any)
	if !ok {
		return nil, contract(s, "server_step", "returned %s; it must return a dict (the next global state)", describe(res))
	}
	return Global(g), nil
}

// Evaluate runs the strategy's evaluate(global, data, params), the metrics
// of a global state on a dataset (as sums, like client metrics). A strategy
// without evaluate is diag.MissingFunction.
func Evaluate(ctx context.Context, env script.Env, s *Strategy, global Global, data *model.Dataset) (map[string]float64, error) {
	env.Training = nil
	if !s.Entry.HasFunc("evaluate") {
		return nil, diag.New(diag.MissingFunction, s.Subject(), "%s defines no evaluate(global, data, params)", s.Entry.Name).
			At(s.Entry.Path, 0, 0).WithHelp("add def evaluate(global, data, params) returning a dict of numbers")
	}
	res, err := script.Call(ctx, env, s.Entry, "evaluate", map[string]any(global), data, s.params())
	if err != nil {
		return nil, err
	}
	m, ok := res.(map[string]any)
	if !ok {
		return nil, contract(s, "evaluate", "returned %s; it must return a dict of numbers", describe(res))
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		f, ok := asNumber(v)
		if !ok {
			return nil, contract(s, "evaluate", "returned [%q] = %s; metrics are numbers", k, describe(v))
		}
		out[k] = f
	}
	return out, nil
}

func (s *Strategy) params() map[string]any {
	if s.Params == nil {
		return map[string]any{}
	}
	return s.Params
}

// describe names a result value's type for contract messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "a bool"
	case int64:
		return fmt.Sprintf("the int %d", x)
	case float64:
		return fmt.Sprintf("the float %v", x)
	case string:
		return fmt.Sprintf("the string %q", x)
	case []float64:
		return "a vector"
	case []any:
		return "a list"
	case map[string]any:
		return "a dict"
	}
	return fmt.Sprintf("a %T", v)
}
