package script

import (
	"errors"
	"fmt"
	"math"

	starlarkmath "go.starlark.net/lib/math"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/scellis/scellis/internal/repmath"
)

// mathModule is Starlark's math module with exp, log and tanh computed by
// repmath, so the functions content uses most give the same bits on every
// architecture (Go's math.Exp, Log and Tanh differ by an ulp between amd64
// and arm64). The other transcendental functions (sin, cos, tan, their
// inverses, hypot, the other hyperbolic ones, gamma, pow with a fractional
// exponent) are Go's and may still differ across architectures; see
// docs/verification.md, "Across architectures".
var mathModule = func() *starlarkstruct.Module {
	m := &starlarkstruct.Module{Name: starlarkmath.Module.Name, Members: starlark.StringDict{}}
	for name, v := range starlarkmath.Module.Members {
		m.Members[name] = v
	}
	m.Members["exp"] = unaryMath("exp", repmath.Exp)
	m.Members["tanh"] = unaryMath("tanh", repmath.Tanh)
	m.Members["log"] = starlark.NewBuiltin("log", mathLog)
	return m
}()

// floatArg unpacks a Starlark int or float as a float64, as the math
// module does.
type floatArg float64

func (p *floatArg) Unpack(v starlark.Value) error {
	f, ok := starlark.AsFloat(v)
	if !ok {
		return fmt.Errorf("got %s, want float or int", v.Type())
	}
	*p = floatArg(f)
	return nil
}

func unaryMath(name string, fn func(float64) float64) *starlark.Builtin {
	return starlark.NewBuiltin(name, func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x floatArg
		if err := starlark.UnpackPositionalArgs(name, args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		return starlark.Float(fn(float64(x))), nil
	})
}

// mathLog is math.log(x[, base]).
func mathLog(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, base floatArg = 0, math.E
	if err := starlark.UnpackPositionalArgs("log", args, kwargs, 1, &x, &base); err != nil {
		return nil, err
	}
	if base == 1 {
		return nil, errors.New("division by zero")
	}
	if base == math.E {
		return starlark.Float(repmath.Log(float64(x))), nil
	}
	return starlark.Float(repmath.Log(float64(x)) / repmath.Log(float64(base))), nil
}
