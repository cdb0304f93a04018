package script

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/tensor"
)

// tensorModule exposes package tensor: vectors and matrices as immutable
// values, every operation returning a new one.
var tensorModule = makeModule("tensor", map[string]nativeFunc{
	"vec": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := unpack("tensor.vec", args, kw, "x", &x); err != nil {
			return nil, err
		}
		if v, ok := x.(*vectorValue); ok {
			return v, nil
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		return newVector(v), nil
	},
	"zeros": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		return filled(st, "tensor.zeros", args, kw, 0)
	},
	"ones": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		return filled(st, "tensor.ones", args, kw, 1)
	},
	"add": binaryVec("tensor.add", tensor.Add),
	"sub": binaryVec("tensor.sub", tensor.Sub),
	"mul": binaryVec("tensor.mul", tensor.Mul),
	"scale": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var a, s starlark.Value
		if err := unpack("tensor.scale", args, kw, "a", &a, "s", &s); err != nil {
			return nil, err
		}
		v, err := st.toVector(a, "a")
		if err != nil {
			return nil, err
		}
		f, err := toFloat(s, "s")
		if err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(v)), "tensor.scale"); err != nil {
			return nil, err
		}
		return newVector(tensor.Scale(v, f)), nil
	},
	"axpy": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var alpha, x, y starlark.Value
		if err := unpack("tensor.axpy", args, kw, "alpha", &alpha, "x", &x, "y", &y); err != nil {
			return nil, err
		}
		a, err := toFloat(alpha, "alpha")
		if err != nil {
			return nil, err
		}
		xv, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		yv, err := st.toVector(y, "y")
		if err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(yv)), "tensor.axpy"); err != nil {
			return nil, err
		}
		out, err := tensor.Axpy(a, xv, yv)
		if err != nil {
			return nil, err
		}
		return newVector(out), nil
	},
	"dot": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		a, b, err := twoVectors(st, "tensor.dot", args, kw)
		if err != nil {
			return nil, err
		}
		d, err := tensor.Dot(a, b)
		return starlark.Float(d), err
	},
	"norm": unaryScalar("tensor.norm", tensor.Norm2),
	"sum":  unaryScalar("tensor.sum", tensor.Sum),
	// fast_sum is the convergent tier's example of a fast path: see mod_check.go.
	"fast_sum": fastSum,
	"mean": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := unpack("tensor.mean", args, kw, "x", &x); err != nil {
			return nil, err
		}
		// A list whose first element is a vector or a list is a list of
		// vectors: their elementwise mean. Otherwise, the mean of the numbers.
		if l, ok := x.(starlark.Indexable); ok && !isNative(x) && l.Len() > 0 {
			switch l.Index(0).(type) {
			case *vectorValue, *starlark.List, starlark.Tuple:
				vs, err := st.toVectors(x, "x")
				if err != nil {
					return nil, err
				}
				ws := make([]float64, len(vs))
				for i := range ws {
					ws[i] = 1
				}
				return weightedMean(st, vs, ws)
			}
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		if len(v) == 0 {
			return nil, fmt.Errorf("mean of an empty vector")
		}
		return starlark.Float(tensor.Mean(v)), nil
	},
	"weighted_mean": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var vsv, wsv starlark.Value
		if err := unpack("tensor.weighted_mean", args, kw, "vectors", &vsv, "weights", &wsv); err != nil {
			return nil, err
		}
		vs, err := st.toVectors(vsv, "vectors")
		if err != nil {
			return nil, err
		}
		ws, err := st.toVector(wsv, "weights")
		if err != nil {
			return nil, err
		}
		return weightedMean(st, vs, ws)
	},
	"count_le": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x, t starlark.Value
		if err := unpack("tensor.count_le", args, kw, "x", &x, "t", &t); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		th, err := toFloat(t, "t")
		if err != nil {
			return nil, err
		}
		n := 0
		for _, e := range v {
			if e <= th {
				n++
			}
		}
		return starlark.MakeInt(n), nil
	},
	"concat": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := unpack("tensor.concat", args, kw, "vectors", &x); err != nil {
			return nil, err
		}
		vs, err := st.toVectors(x, "vectors")
		if err != nil {
			return nil, err
		}
		n := 0
		for _, v := range vs {
			n += len(v)
		}
		out, err := st.newOwnedVector(n, "tensor.concat")
		if err != nil {
			return nil, err
		}
		out = out[:0]
		for _, v := range vs {
			out = append(out, v...)
		}
		return newVector(out), nil
	},
	"mat": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var rows starlark.Value
		if err := unpack("tensor.mat", args, kw, "rows", &rows); err != nil {
			return nil, err
		}
		if m, ok := rows.(*matrixValue); ok {
			return m, nil
		}
		m, err := st.toMatrix(rows, "rows")
		if err != nil {
			return nil, err
		}
		return &matrixValue{m: m}, nil
	},
	"reshape": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var r, c int
		if err := unpack("tensor.reshape", args, kw, "x", &x, "rows", &r, "cols", &c); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		if n, ok := mulSize(r, c); !ok || n != len(v) {
			return nil, fmt.Errorf("cannot reshape %d elements into %d×%d", len(v), r, c)
		}
		// The matrix shares the (immutable) vector's storage.
		borrowed := false
		if xv, ok := x.(*vectorValue); ok {
			borrowed = xv.borrowed
		}
		return &matrixValue{m: &tensor.Matrix{Rows: r, Cols: c, Data: v}, borrowed: borrowed}, nil
	},
	"matmul": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var a, b starlark.Value
		if err := unpack("tensor.matmul", args, kw, "a", &a, "b", &b); err != nil {
			return nil, err
		}
		am, err := st.toMatrix(a, "a")
		if err != nil {
			return nil, err
		}
		if _, ok := b.(*vectorValue); ok {
			x, _ := st.toVector(b, "b")
			if err := st.reserve(bytesOf(am.Rows), "tensor.matmul"); err != nil {
				return nil, err
			}
			out, err := tensor.MatVec(am, x)
			if err != nil {
				return nil, err
			}
			return newVector(out), nil
		}
		bm, err := st.toMatrix(b, "b")
		if err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf2(am.Rows, bm.Cols), "tensor.matmul"); err != nil {
			return nil, err
		}
		c, err := tensor.MatMulChecked(am, bm, st.nativeWork)
		if err != nil {
			return nil, err
		}
		return &matrixValue{m: c}, nil
	},
	"transpose": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		m, err := oneMatrix(st, "tensor.transpose", args, kw)
		if err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(m.Data)), "tensor.transpose"); err != nil {
			return nil, err
		}
		return &matrixValue{m: m.T()}, nil
	},
	"rows": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		m, err := oneMatrix(st, "tensor.rows", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.MakeInt(m.Rows), nil
	},
	"cols": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		m, err := oneMatrix(st, "tensor.cols", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.MakeInt(m.Cols), nil
	},
	"row": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var i int
		if err := unpack("tensor.row", args, kw, "m", &x, "i", &i); err != nil {
			return nil, err
		}
		m, err := st.toMatrix(x, "m")
		if err != nil {
			return nil, err
		}
		if i < 0 || i >= m.Rows {
			return nil, fmt.Errorf("row %d out of range for a %d×%d matrix", i, m.Rows, m.Cols)
		}
		return &vectorValue{data: m.Row(i), borrowed: true}, nil
	},
	"get": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var i int
		j := -1
		if err := unpack("tensor.get", args, kw, "x", &x, "i", &i, "j?", &j); err != nil {
			return nil, err
		}
		if v, ok := x.(*vectorValue); ok {
			if i < 0 || i >= len(v.data) {
				return nil, fmt.Errorf("index %d out of range for a vector of length %d", i, len(v.data))
			}
			return starlark.Float(v.data[i]), nil
		}
		m, err := st.toMatrix(x, "x")
		if err != nil {
			return nil, err
		}
		if i < 0 || i >= m.Rows || j < 0 || j >= m.Cols {
			return nil, fmt.Errorf("index (%d, %d) out of range for a %d×%d matrix", i, j, m.Rows, m.Cols)
		}
		return starlark.Float(m.At(i, j)), nil
	},
	"block": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var r0, r1, c0, c1 int
		if err := unpack("tensor.block", args, kw, "m", &x, "r0", &r0, "r1", &r1, "c0", &c0, "c1", &c1); err != nil {
			return nil, err
		}
		m, err := st.toMatrix(x, "m")
		if err != nil {
			return nil, err
		}
		if r1 > r0 && c1 > c0 {
			if err := st.reserve(bytesOf2(r1-r0, c1-c0), "tensor.block"); err != nil {
				return nil, err
			}
		}
		b, err := m.Slice(r0, r1, c0, c1)
		if err != nil {
			return nil, err
		}
		return &matrixValue{m: b}, nil
	},
	"tolist": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := unpack("tensor.tolist", args, kw, "x", &x); err != nil {
			return nil, err
		}
		switch v := x.(type) {
		case *vectorValue:
			return floatList(st, v.data)
		case *matrixValue:
			if err := st.reserve(uint64(v.m.Rows)*listBytes+uint64(len(v.m.Data))*(slotBytes+floatBytes), "tensor.tolist"); err != nil {
				return nil, err
			}
			rows := make([]starlark.Value, v.m.Rows)
			for i := range rows {
				rows[i] = floats(v.m.Row(i))
			}
			return starlark.NewList(rows), nil
		}
		return nil, fmt.Errorf("x must be a vector or a matrix, got %s", x.Type())
	},
})

func filled(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple, x float64) (starlark.Value, error) {
	var n int
	if err := unpack(name, args, kw, "n", &n); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("length must not be negative, got %d", n)
	}
	v, err := st.newOwnedVector(n, name)
	if err != nil {
		return nil, err
	}
	if x != 0 {
		for i := range v {
			v[i] = x
		}
	}
	return newVector(v), nil
}

func twoVectors(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (tensor.Vector, tensor.Vector, error) {
	var a, b starlark.Value
	if err := unpack(name, args, kw, "a", &a, "b", &b); err != nil {
		return nil, nil, err
	}
	av, err := st.toVector(a, "a")
	if err != nil {
		return nil, nil, err
	}
	bv, err := st.toVector(b, "b")
	if err != nil {
		return nil, nil, err
	}
	return av, bv, nil
}

func binaryVec(name string, op func(a, b tensor.Vector) (tensor.Vector, error)) nativeFunc {
	return func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		a, b, err := twoVectors(st, name, args, kw)
		if err != nil {
			return nil, err
		}
		if err := st.reserve(bytesOf(len(a)), name); err != nil {
			return nil, err
		}
		out, err := op(a, b)
		if err != nil {
			return nil, err
		}
		return newVector(out), nil
	}
}

func unaryScalar(name string, op func(tensor.Vector) float64) nativeFunc {
	return func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := unpack(name, args, kw, "x", &x); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		return starlark.Float(op(v)), nil
	}
}

func oneMatrix(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (*tensor.Matrix, error) {
	var x starlark.Value
	if err := unpack(name, args, kw, "m", &x); err != nil {
		return nil, err
	}
	return st.toMatrix(x, "m")
}

func weightedMean(st *callState, vs []tensor.Vector, ws []float64) (starlark.Value, error) {
	if len(vs) > 0 {
		if err := st.reserve(bytesOf(len(vs[0])), "tensor.weighted_mean"); err != nil {
			return nil, err
		}
	}
	out, err := tensor.WeightedMean(vs, ws)
	if err != nil {
		return nil, err
	}
	return newVector(out), nil
}

// floats converts numbers to a Starlark list of floats (unreserved: callers
// reserve).
func floats(v []float64) *starlark.List {
	elems := make([]starlark.Value, len(v))
	for i, x := range v {
		elems[i] = starlark.Float(x)
	}
	return starlark.NewList(elems)
}

func floatList(st *callState, v []float64) (starlark.Value, error) {
	if err := st.reserve(listBytes+uint64(len(v))*(slotBytes+floatBytes), "a list of floats"); err != nil {
		return nil, err
	}
	return floats(v), nil
}
