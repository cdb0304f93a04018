package script

import (
	"errors"
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/tensor"
)

// predeclared is everything content sees besides the Starlark universe:
// the native modules, the pure math module (exp, log and tanh replayable
// across architectures: mod_math.go), and memory-checked versions of
// the built-ins that materialise iterables. Nothing here reads a file, the
// network, the clock or the environment.
var predeclared = starlark.StringDict{
	"tensor": tensorModule,
	"rng":    rngModule,
	"stats":  statsModule,
	"data":   dataModule,
	"model":  modelModule,
	"math":   mathModule,
	"check":  checkModule,
}

func init() {
	for _, name := range []string{"list", "tuple", "sorted", "set", "enumerate", "zip"} {
		predeclared[name] = sizedBuiltin(starlark.Universe[name].(*starlark.Builtin))
	}
	predeclared[repeatName] = repeatBuiltin
	predeclared.Freeze()
}

// nativeFunc is a native's implementation; st is the calling sandbox.
type nativeFunc func(st *callState, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

// native wraps an implementation as a Starlark built-in named
// "module.fn". Plain errors become diag.NativeArgument; diagnostics (a
// memory reservation refused) pass through.
func native(module, fn string, impl nativeFunc) *starlark.Builtin {
	name := module + "." + fn
	return starlark.NewBuiltin(name, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (v starlark.Value, err error) {
		// A panic in a native is a bug in Scellis, not in the content; it
		// fails this call rather than the process running many.
		defer func() {
			if r := recover(); r != nil {
				v, err = nil, fmt.Errorf("internal error in %s: %v", name, r)
			}
		}()
		v, err = impl(stateOf(thread), args, kwargs)
		if err != nil {
			var d *diag.Diagnostic
			if errors.As(err, &d) {
				if d.Subject == "" {
					d.Subject = name
				}
				return nil, d
			}
			msg := strings.TrimPrefix(err.Error(), name+": ")
			return nil, diag.New(diag.NativeArgument, name, "%s", msg).
				WithHelp("see %s in docs/content.md", name)
		}
		return v, nil
	})
}

func makeModule(name string, fns map[string]nativeFunc) *starlarkstruct.Module {
	m := &starlarkstruct.Module{Name: name, Members: starlark.StringDict{}}
	for fn, impl := range fns {
		m.Members[fn] = native(name, fn, impl)
	}
	return m
}

// sizedBuiltin wraps a universe built-in that materialises its first
// argument(s), reserving the result's size first when the arguments have a
// length (so list(range(10**9)) is refused before it allocates).
func sizedBuiltin(b *starlark.Builtin) *starlark.Builtin {
	perElem := uint64(slotBytes)
	switch b.Name() {
	case "enumerate", "zip":
		perElem = slotBytes + tupleBytes + 2*slotBytes
	case "set":
		perElem = entryBytes + slotBytes
	}
	return starlark.NewBuiltin(b.Name(), func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		n := -1
		for i, a := range args {
			if b.Name() != "zip" && i > 0 {
				break
			}
			l, ok := a.(starlark.Sequence)
			if !ok {
				n = -1
				break
			}
			if n < 0 || l.Len() < n {
				n = l.Len()
			}
		}
		if n > 0 {
			if err := stateOf(thread).reserve(uint64(n)*perElem, fmt.Sprintf("%s() of %d elements", b.Name(), n)); err != nil {
				return nil, err
			}
		}
		return b.CallInternal(thread, args, kwargs)
	})
}

// Argument conversion helpers. They return plain errors; native turns them
// into diag.NativeArgument.

func toFloat(v starlark.Value, what string) (float64, error) {
	f, ok := asFloat(v)
	if !ok {
		return 0, fmt.Errorf("%s must be a number, got %s", what, v.Type())
	}
	return f, nil
}

func toInt(v starlark.Value, what string) (int, error) {
	i, ok := v.(starlark.Int)
	if !ok {
		return 0, fmt.Errorf("%s must be an int, got %s", what, v.Type())
	}
	n, ok := i.Int64()
	if !ok || n != int64(int(n)) {
		return 0, fmt.Errorf("%s is too large", what)
	}
	return int(n), nil
}

func toCount(v starlark.Value, what string) (int, error) {
	n, err := toInt(v, what)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("%s must not be negative, got %d", what, n)
	}
	return n, nil
}

// toVector accepts a vector (shared, not copied) or a list or tuple of
// numbers (copied, the copy reserved against the memory budget).
func (st *callState) toVector(v starlark.Value, what string) (tensor.Vector, error) {
	switch x := v.(type) {
	case *vectorValue:
		return x.data, nil
	case starlark.Indexable:
		if _, ok := x.(*matrixValue); ok {
			break
		}
		if _, ok := x.(starlark.String); ok {
			break
		}
		n := x.Len()
		if err := st.reserve(bytesOf(n), fmt.Sprintf("converting %s to a vector", what)); err != nil {
			return nil, err
		}
		out := make(tensor.Vector, n)
		for i := range out {
			f, ok := asFloat(x.Index(i))
			if !ok {
				return nil, fmt.Errorf("%s[%d] must be a number, got %s", what, i, x.Index(i).Type())
			}
			out[i] = f
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s must be a vector or a list of numbers, got %s", what, v.Type())
}

// toVectors accepts a list or tuple of vectors (or lists of numbers).
func (st *callState) toVectors(v starlark.Value, what string) ([]tensor.Vector, error) {
	x, ok := v.(starlark.Indexable)
	if !ok || isNative(v) {
		return nil, fmt.Errorf("%s must be a list of vectors, got %s", what, v.Type())
	}
	out := make([]tensor.Vector, x.Len())
	for i := range out {
		vec, err := st.toVector(x.Index(i), fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		out[i] = vec
	}
	return out, nil
}

func isNative(v starlark.Value) bool {
	switch v.(type) {
	case *vectorValue, *matrixValue, starlark.String:
		return true
	}
	return false
}

// toMatrix accepts a matrix (shared) or a list of rows (copied).
func (st *callState) toMatrix(v starlark.Value, what string) (*tensor.Matrix, error) {
	if m, ok := v.(*matrixValue); ok {
		return m.m, nil
	}
	rows, ok := v.(starlark.Indexable)
	if !ok || isNative(v) {
		return nil, fmt.Errorf("%s must be a matrix or a list of rows, got %s", what, v.Type())
	}
	if rows.Len() == 0 {
		return &tensor.Matrix{}, nil
	}
	first, err := st.toVector(rows.Index(0), what+"[0]")
	if err != nil {
		return nil, err
	}
	cols := len(first)
	if err := st.reserve(bytesOf2(rows.Len(), cols), "building "+what); err != nil {
		return nil, err
	}
	m := &tensor.Matrix{Rows: rows.Len(), Cols: cols, Data: make([]float64, 0, rows.Len()*cols)}
	m.Data = append(m.Data, first...)
	for i := 1; i < rows.Len(); i++ {
		r, err := st.toVector(rows.Index(i), fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		if len(r) != cols {
			return nil, fmt.Errorf("%s[%d] has %d columns, %s[0] has %d", what, i, len(r), what, cols)
		}
		m.Data = append(m.Data, r...)
	}
	return m, nil
}

// newOwnedVector reserves and allocates a vector of n elements.
func (st *callState) newOwnedVector(n int, what string) (tensor.Vector, error) {
	if err := st.reserve(bytesOf(n), what); err != nil {
		return nil, err
	}
	return make(tensor.Vector, n), nil
}

// unpack is starlark.UnpackArgs with the native's name.
func unpack(fn string, args starlark.Tuple, kwargs []starlark.Tuple, pairs ...any) error {
	return starlark.UnpackArgs(fn, args, kwargs, pairs...)
}

// num unpacks an int or a float argument as a float64 (starlark.UnpackArgs
// accepts only floats for *float64).
type num float64

func (n *num) Unpack(v starlark.Value) error {
	f, ok := asFloat(v)
	if !ok {
		return fmt.Errorf("got %s, want a number", v.Type())
	}
	*n = num(f)
	return nil
}
