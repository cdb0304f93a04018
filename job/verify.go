package job

import (
	"context"
	"fmt"
	"io"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/verify"
)

// Tier is the reproducibility tier the plan runs under.
func (p *Plan) Tier() verify.Tier { return p.Spec.Verification.EffectiveTier() }

// Tolerance is the convergent tier's declared tolerance (zero otherwise).
func (p *Plan) Tolerance() verify.Tolerance {
	if p.Tier() != verify.Convergent {
		return verify.Tolerance{}
	}
	return p.Spec.Verification.Tol()
}

// FreivaldsRounds is the k of the job's Freivalds checks (0: none).
func (p *Plan) FreivaldsRounds() int { return p.Spec.Verification.Freivalds }

// Method is how the plan's shards are verified on a pool whose jobs take
// replicas peers: the method receipts and result.json record.
func (p *Plan) Method(replicas int) string {
	switch {
	case p.FreivaldsRounds() > 0:
		return verify.MethodFreivalds(p.FreivaldsRounds())
	case p.Tier() == verify.Convergent:
		return verify.MethodConvergent(replicas, p.Tolerance())
	}
	return verify.MethodExact(replicas)
}

// checkVerification refuses a declared tier or method the content cannot
// honour, before anything runs: a guarantee the pool would silently not
// apply is worse than a refusal.
func (p *Plan) checkVerification() error {
	v, spec := p.Spec.Verification, p.Spec
	at := func(d *diag.Diagnostic) error { return spec.at(d, "verification") }
	tier := v.EffectiveTier()
	if _, err := verify.ParseTier(v.Tier); err != nil {
		return at(diag.New(diag.InvalidValue, "verification.tier", "%v", err).
			WithHelp("use replayable (byte-exact) or convergent (within a tolerance)"))
	}
	if tier == verify.Replayable && (v.Tolerance > 0 || v.RelTolerance > 0) {
		return at(diag.New(diag.InvalidValue, "verification", "the job declares the replayable tier and a tolerance: replayable results are byte-exact").
			WithHelp("remove the tolerance, or declare tier: convergent"))
	}
	if tier == verify.Convergent {
		if err := v.Tol().Check(); err != nil {
			return at(diag.New(diag.InvalidValue, "verification.tolerance", "the convergent tier needs a tolerance: %v", err).
				WithHelp("declare tolerance: {abs: 1e-9, rel: 1e-6, per: tensor}"))
		}
		if !p.Program.HasFunc("compare") {
			return at(diag.New(diag.VerifyTierUnsupported, "program "+p.Program.Name,
				"the job declares the convergent tier, but program %s defines no compare(a, b, tolerance): nothing could judge whether two results agree", p.Program.Name).
				WithHelp("add def compare(a, b, tolerance): return check.within(a, b, tolerance) to the program, or run it in the replayable tier"))
		}
	}
	if v.Freivalds > 0 {
		if !p.Program.HasFunc("verify") {
			return at(diag.New(diag.VerifyTierUnsupported, "program "+p.Program.Name,
				"the job asks for Freivalds checks, but program %s defines no verify(params, inputs, result, k)", p.Program.Name).
				WithHelp("Freivalds checks matrix products: add a verify function calling check.freivalds(a, b, result, k), or remove verification.freivalds"))
		}
		if tier == verify.Convergent {
			return at(diag.New(diag.InvalidValue, "verification", "the job asks for both Freivalds checks and a convergent tolerance").
				WithHelp("Freivalds checks one execution against the product's rounding bound; a tolerance compares replicas: choose one"))
		}
		if v.Replicas > 1 {
			return at(diag.New(diag.InvalidValue, "verification", "the job asks for Freivalds checks and %d replicas: a checked shard runs once", v.Replicas).
				WithHelp("remove verification.replicas (a Freivalds-checked shard needs one execution)"))
		}
	}
	return nil
}

// Compare judges two results of shard sh with the program's compare
// function under the declared tolerance. compare returns a bool, or a dict
// with "within" (check.within's answer, whose "where" and "reason" are
// kept).
func (p *Plan) Compare(ctx context.Context, sh Shard, a, b *Result) (verify.Comparison, error) {
	t := p.Tolerance()
	tol := map[string]any{"abs": t.Abs, "rel": t.Rel, "per": t.Per}
	if t.Per == "" {
		tol["per"] = verify.PerTensor
	}
	out, err := callCheck(ctx, p, p.env(sh.ID.Digest()), "compare", a.Value, b.Value, tol)
	if err != nil {
		return verify.Comparison{}, err
	}
	switch v := out.(type) {
	case bool:
		return verify.Comparison{Within: v}, nil
	case map[string]any:
		within, ok := v["within"].(bool)
		if ok {
			c := verify.Comparison{Within: within}
			c.Where, _ = v["where"].(string)
			c.Reason, _ = v["reason"].(string)
			c.MaxAbs, _ = v["max_abs"].(float64)
			return c, nil
		}
	}
	return verify.Comparison{}, diag.New(diag.ContentShape, "program "+p.Program.Name,
		"compare returned %s, want a bool or check.within's dict", script.Describe(out))
}

// CheckProduct runs the program's verify(params, inputs, result, k) on one
// result, with rnd as the randomness of check.freivalds. rnd must be
// drawn where the producer of the result cannot predict it, after its
// commitment (the verifier passes crypto/rand.Reader).
func (p *Plan) CheckProduct(ctx context.Context, sh Shard, res *Result, rnd io.Reader) (bool, error) {
	env := p.env(sh.ID.Digest())
	env.Verifier = rnd
	inputs := make(map[string]any, len(p.Inputs))
	for _, in := range p.Inputs {
		inputs[in.Name] = in.Data
	}
	out, err := callCheck(ctx, p, env, "verify", p.shardParams(sh), inputs, res.Value, int64(p.FreivaldsRounds()))
	if err != nil {
		return false, err
	}
	switch v := out.(type) {
	case bool:
		return v, nil
	case map[string]any:
		if ok, isBool := v["ok"].(bool); isBool {
			return ok, nil
		}
	}
	return false, diag.New(diag.ContentShape, "program "+p.Program.Name,
		"verify returned %s, want a bool or check.freivalds's dict", script.Describe(out))
}

func callCheck(ctx context.Context, p *Plan, env script.Env, fn string, args ...any) (any, error) {
	out, err := script.Call(ctx, env, p.Program, fn, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fn, err)
	}
	return out, nil
}
