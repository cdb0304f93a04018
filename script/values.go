package script

import (
	"fmt"
	"math"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/scellis/scellis/tensor"
)

// vectorValue is a tensor.Vector inside Starlark. It is immutable: natives
// return new vectors, so a vector lent by the engine (borrowed) is never
// written, and a fresh one can be handed back without copying.
type vectorValue struct {
	data     tensor.Vector
	borrowed bool // lent by the engine (an argument): not charged to the call
}

var (
	_ starlark.Indexable  = (*vectorValue)(nil)
	_ starlark.Sliceable  = (*vectorValue)(nil)
	_ starlark.Iterable   = (*vectorValue)(nil)
	_ starlark.HasBinary  = (*vectorValue)(nil)
	_ starlark.HasUnary   = (*vectorValue)(nil)
	_ starlark.Comparable = (*vectorValue)(nil)
	_ starlark.Indexable  = (*matrixValue)(nil)
	_ starlark.Comparable = (*matrixValue)(nil)
	_ starlark.HasAttrs   = (*matrixValue)(nil)
)

func newVector(v tensor.Vector) *vectorValue { return &vectorValue{data: v} }

func (v *vectorValue) String() string {
	var b strings.Builder
	b.WriteString("vector([")
	for i, x := range v.data {
		if i == 6 && len(v.data) > 8 {
			fmt.Fprintf(&b, ", … (%d elements)", len(v.data))
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(starlark.Float(x).String())
	}
	b.WriteString("])")
	return b.String()
}
func (v *vectorValue) Type() string          { return "vector" }
func (v *vectorValue) Freeze()               {}
func (v *vectorValue) Truth() starlark.Bool  { return len(v.data) > 0 }
func (v *vectorValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: vector") }
func (v *vectorValue) Len() int              { return len(v.data) }
func (v *vectorValue) Index(i int) starlark.Value {
	return starlark.Float(v.data[i])
}
func (v *vectorValue) Slice(start, end, step int) starlark.Value {
	var out tensor.Vector
	if step == 1 {
		if end > start {
			out = v.data[start:end].Clone()
		}
	} else {
		sign := signum(step)
		for i := start; signum(end-i) == sign; i += step {
			out = append(out, v.data[i])
		}
	}
	if out == nil {
		out = tensor.Vector{}
	}
	return newVector(out)
}

func signum(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

func (v *vectorValue) Iterate() starlark.Iterator { return &vectorIter{v: v} }

type vectorIter struct {
	v *vectorValue
	i int
}

func (it *vectorIter) Next(p *starlark.Value) bool {
	if it.i >= len(it.v.data) {
		return false
	}
	*p = starlark.Float(it.v.data[it.i])
	it.i++
	return true
}
func (it *vectorIter) Done() {}

// Binary gives vectors the arithmetic content expects: v + w, v - w,
// v * s, s * v, v / s.
func (v *vectorValue) Binary(op syntax.Token, y starlark.Value, side starlark.Side) (starlark.Value, error) {
	switch op {
	case syntax.PLUS, syntax.MINUS:
		w, ok := y.(*vectorValue)
		if !ok {
			return nil, nil
		}
		a, b := v.data, w.data
		if side == starlark.Right {
			a, b = b, a
		}
		var out tensor.Vector
		var err error
		if op == syntax.PLUS {
			out, err = tensor.Add(a, b)
		} else {
			out, err = tensor.Sub(a, b)
		}
		if err != nil {
			return nil, err
		}
		return newVector(out), nil
	case syntax.STAR:
		s, ok := asFloat(y)
		if !ok {
			return nil, nil
		}
		return newVector(tensor.Scale(v.data, s)), nil
	case syntax.SLASH:
		if side == starlark.Right {
			return nil, nil
		}
		s, ok := asFloat(y)
		if !ok {
			return nil, nil
		}
		if s == 0 {
			return nil, fmt.Errorf("vector division by zero")
		}
		out := make(tensor.Vector, len(v.data))
		for i, x := range v.data {
			out[i] = x / s
		}
		return newVector(out), nil
	}
	return nil, nil
}

func (v *vectorValue) Unary(op syntax.Token) (starlark.Value, error) {
	switch op {
	case syntax.MINUS:
		return newVector(tensor.Scale(v.data, -1)), nil
	case syntax.PLUS:
		return v, nil
	}
	return nil, nil
}

// CompareSameType supports == and != (bitwise equality of elements).
func (v *vectorValue) CompareSameType(op syntax.Token, y starlark.Value, _ int) (bool, error) {
	w := y.(*vectorValue)
	switch op {
	case syntax.EQL:
		return tensor.Equal(v.data, w.data), nil
	case syntax.NEQ:
		return !tensor.Equal(v.data, w.data), nil
	}
	return false, fmt.Errorf("vectors support only == and !=")
}

func asFloat(v starlark.Value) (float64, bool) {
	switch x := v.(type) {
	case starlark.Float:
		return float64(x), true
	case starlark.Int:
		return float64(x.Float()), true
	}
	return 0, false
}

// matrixValue is a tensor.Matrix inside Starlark, immutable like vectors.
// m[i] is row i as a vector; m.rows and m.cols are its dimensions.
type matrixValue struct {
	m        *tensor.Matrix
	borrowed bool
}

func (m *matrixValue) String() string {
	return fmt.Sprintf("matrix(%d×%d)", m.m.Rows, m.m.Cols)
}
func (m *matrixValue) Type() string          { return "matrix" }
func (m *matrixValue) Freeze()               {}
func (m *matrixValue) Truth() starlark.Bool  { return m.m.Rows > 0 }
func (m *matrixValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: matrix") }
func (m *matrixValue) Len() int              { return m.m.Rows }
func (m *matrixValue) Index(i int) starlark.Value {
	// A row view shares the matrix's storage; it is read-only like the
	// matrix, and not charged again.
	return &vectorValue{data: m.m.Row(i), borrowed: true}
}
func (m *matrixValue) Attr(name string) (starlark.Value, error) {
	switch name {
	case "rows":
		return starlark.MakeInt(m.m.Rows), nil
	case "cols":
		return starlark.MakeInt(m.m.Cols), nil
	}
	return nil, nil
}
func (m *matrixValue) AttrNames() []string { return []string{"cols", "rows"} }
func (m *matrixValue) CompareSameType(op syntax.Token, y starlark.Value, _ int) (bool, error) {
	n := y.(*matrixValue)
	eq := m.m.Rows == n.m.Rows && m.m.Cols == n.m.Cols && tensor.Equal(m.m.Data, n.m.Data)
	switch op {
	case syntax.EQL:
		return eq, nil
	case syntax.NEQ:
		return !eq, nil
	}
	return false, fmt.Errorf("matrices support only == and !=")
}

// bytesOf is the memory a slice of n float64 takes, saturating at
// math.MaxUint64 (a reservation that large fails; it must never wrap to a
// small one).
func bytesOf(n int) uint64 {
	if n <= 0 {
		return 0
	}
	if uint64(n) > math.MaxUint64/8 {
		return math.MaxUint64
	}
	return uint64(n) * 8
}

// bytesOf2 is the memory of rows×cols float64, with the product checked:
// content chooses both sizes, so their product must not overflow into a
// small reservation.
func bytesOf2(rows, cols int) uint64 {
	n, ok := mulSize(rows, cols)
	if !ok {
		return math.MaxUint64
	}
	return bytesOf(n)
}

// mulSize returns a·b for non-negative sizes, and false when it would
// overflow int (or a size is negative).
func mulSize(a, b int) (int, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > math.MaxInt/b {
		return 0, false
	}
	return a * b, true
}

// finite reports whether f is neither NaN nor ±Inf.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
