package script

import (
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/verify"
	"github.com/scellis/scellis/verify/freivalds"
)

// checkModule is what content's compare and verify functions call: the
// numeric work of a comparison or a Freivalds check runs natively, the
// decision of what to compare stays with the content.
var checkModule = makeModule("check", map[string]nativeFunc{
	"within":    checkWithin,
	"freivalds": checkFreivalds,
})

// check.within(a, b, tolerance) compares two result values under a
// tolerance dict {abs, rel, per} (verify.Compare) and returns
// {"within": bool, "max_abs": float, "where": str, "reason": str}.
func checkWithin(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
	var a, b, tol starlark.Value
	if err := unpack("check.within", args, kw, "a", &a, "b", &b, "tolerance", &tol); err != nil {
		return nil, err
	}
	av, err := fromStarlark(a, "a", 0)
	if err != nil {
		return nil, err
	}
	bv, err := fromStarlark(b, "b", 0)
	if err != nil {
		return nil, err
	}
	t, err := toTolerance(tol)
	if err != nil {
		return nil, err
	}
	c := verify.Compare(av, bv, t)
	out := starlark.NewDict(4)
	out.SetKey(starlark.String("within"), starlark.Bool(c.Within))
	out.SetKey(starlark.String("max_abs"), starlark.Float(c.MaxAbs))
	out.SetKey(starlark.String("where"), starlark.String(c.Where))
	out.SetKey(starlark.String("reason"), starlark.String(c.Reason))
	return out, nil
}

func toTolerance(v starlark.Value) (verify.Tolerance, error) {
	var t verify.Tolerance
	d, ok := v.(*starlark.Dict)
	if !ok {
		f, ok := asFloat(v)
		if !ok {
			return t, fmt.Errorf("tolerance must be a dict {abs, rel, per} or a number, got %s", v.Type())
		}
		t.Abs = f
		return t, t.Check()
	}
	for _, item := range d.Items() {
		k, _ := starlark.AsString(item[0])
		switch k {
		case "abs", "rel":
			f, ok := asFloat(item[1])
			if !ok {
				return t, fmt.Errorf("tolerance.%s must be a number, got %s", k, item[1].Type())
			}
			if k == "abs" {
				t.Abs = f
			} else {
				t.Rel = f
			}
		case "per":
			s, ok := starlark.AsString(item[1])
			if !ok {
				return t, fmt.Errorf("tolerance.per must be a string, got %s", item[1].Type())
			}
			t.Per = s
		default:
			return t, fmt.Errorf("tolerance has an unknown key %s (want abs, rel, per)", item[0])
		}
	}
	return t, t.Check()
}

// check.freivalds(a, b, c, k) checks c = a·b with k Freivalds rounds whose
// random vectors come from the verifier's randomness (Env.Verifier), and
// returns {"ok": bool, "rounds": k, "row": int}. Content cannot choose or
// see the vectors; outside a verifier it fails.
func checkFreivalds(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
	var a, b, c starlark.Value
	var k int
	if err := unpack("check.freivalds", args, kw, "a", &a, "b", &b, "c", &c, "k", &k); err != nil {
		return nil, err
	}
	if st.env.Verifier == nil {
		return nil, diag.New(diag.VerifyCheckFailed, "check.freivalds",
			"check.freivalds runs on a verifier peer only: it draws its random vectors after the result was committed").
			WithHelp("call it from the program's verify(params, inputs, result, k), which the verifier runs")
	}
	am, err := st.toMatrix(a, "a")
	if err != nil {
		return nil, err
	}
	bm, err := st.toMatrix(b, "b")
	if err != nil {
		return nil, err
	}
	cm, err := st.toMatrix(c, "c")
	if err != nil {
		return nil, err
	}
	// Three products with k columns each.
	if err := st.nativeWork(k * (am.Rows*am.Cols + bm.Rows*bm.Cols + cm.Rows*cm.Cols)); err != nil {
		return nil, err
	}
	res, err := freivalds.Check(am, bm, cm, k, st.env.Verifier)
	if err != nil {
		return nil, err
	}
	out := starlark.NewDict(3)
	out.SetKey(starlark.String("ok"), starlark.Bool(res.OK))
	out.SetKey(starlark.String("rounds"), starlark.MakeInt(res.Rounds))
	out.SetKey(starlark.String("row"), starlark.MakeInt(res.Row))
	return out, nil
}

// tensor.fast_sum(x) sums a vector in an order that changes from call to
// call, as a parallel reduction on a GPU or a multithreaded BLAS does: two
// calls agree to rounding, not to the bit. It exists so that the
// convergent tier has honest, bit-different results to verify, and it is
// refused outside that tier (a replayable job's replicas would disagree).
func fastSum(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	if err := unpack("tensor.fast_sum", args, kw, "x", &x); err != nil {
		return nil, err
	}
	if !st.env.Convergent {
		return nil, diag.New(diag.VerifyNondeterministic, "tensor.fast_sum",
			"tensor.fast_sum sums in an order that varies between calls, so its result is not byte-exact").
			WithHelp("declare verification: {tier: convergent, tolerance: ...} and a compare function, or use tensor.sum")
	}
	v, err := st.toVector(x, "x")
	if err != nil {
		return nil, err
	}
	if err := st.reserve(bytesOf(len(v)), "tensor.fast_sum"); err != nil {
		return nil, err
	}
	// The order is a permutation drawn from a generator seeded by
	// crypto/rand: it varies between calls and between peers, which is the
	// point; it is not a secret.
	var seed [32]byte
	rand.Read(seed[:])
	g := mrand.New(mrand.NewChaCha8(seed))
	s := 0.0
	for _, i := range g.Perm(len(v)) {
		s += v[i]
	}
	return starlark.Float(s), nil
}
