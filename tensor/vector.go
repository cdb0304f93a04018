package tensor

import (
	"errors"
	"fmt"
	"math"
)

// ErrShape reports operands whose lengths or dimensions do not agree.
var ErrShape = errors.New("tensor: shape mismatch")

// ErrWeights reports weights that cannot form a weighted mean (negative, not
// finite, or summing to zero).
var ErrWeights = errors.New("tensor: bad weights")

// Vector is a dense vector of float64.
type Vector []float64

// Zeros returns a vector of n zeros.
func Zeros(n int) Vector { return make(Vector, n) }

// Clone returns a copy of v that shares no storage with it.
func (v Vector) Clone() Vector {
	if v == nil {
		return nil
	}
	return append(Vector(make([]float64, 0, len(v))), v...)
}

// Len returns the number of elements.
func (v Vector) Len() int { return len(v) }

func sameLen(op string, a, b Vector) error {
	if len(a) != len(b) {
		return fmt.Errorf("%w: %s of vectors of length %d and %d", ErrShape, op, len(a), len(b))
	}
	return nil
}

// Add returns a+b.
func Add(a, b Vector) (Vector, error) {
	if err := sameLen("add", a, b); err != nil {
		return nil, err
	}
	out := make(Vector, len(a))
	for i := range out {
		out[i] = a[i] + b[i]
	}
	return out, nil
}

// Sub returns a−b.
func Sub(a, b Vector) (Vector, error) {
	if err := sameLen("sub", a, b); err != nil {
		return nil, err
	}
	out := make(Vector, len(a))
	for i := range out {
		out[i] = a[i] - b[i]
	}
	return out, nil
}

// Mul returns the elementwise (Hadamard) product of a and b.
func Mul(a, b Vector) (Vector, error) {
	if err := sameLen("mul", a, b); err != nil {
		return nil, err
	}
	out := make(Vector, len(a))
	for i := range out {
		out[i] = a[i] * b[i]
	}
	return out, nil
}

// Scale returns s·a.
func Scale(a Vector, s float64) Vector {
	out := make(Vector, len(a))
	for i, x := range a {
		out[i] = s * x
	}
	return out
}

// Axpy returns alpha·x + y as a new vector.
func Axpy(alpha float64, x, y Vector) (Vector, error) {
	if err := sameLen("axpy", x, y); err != nil {
		return nil, err
	}
	out := make(Vector, len(y))
	for i := range out {
		out[i] = float64(alpha*x[i]) + y[i]
	}
	return out, nil
}

// AxpyInPlace sets dst = dst + alpha·x, for accumulating without allocating.
func AxpyInPlace(dst Vector, alpha float64, x Vector) error {
	if err := sameLen("axpy", x, dst); err != nil {
		return err
	}
	axpyUnitary(dst, alpha, x)
	return nil
}

func axpyUnitary(dst Vector, alpha float64, x Vector) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += float64(alpha * x[i])
	}
}

// Dot returns the inner product of a and b, summed in index order.
func Dot(a, b Vector) (float64, error) {
	if err := sameLen("dot", a, b); err != nil {
		return 0, err
	}
	return dot(a, b), nil
}

func dot(a, b Vector) float64 {
	b = b[:len(a)]
	s := 0.0
	for i := range a {
		s += float64(a[i] * b[i])
	}
	return s
}

// Norm2 returns the Euclidean norm of a.
func Norm2(a Vector) float64 { return math.Sqrt(dot(a, a)) }

// Sum returns the sum of the elements in index order.
func Sum(a Vector) float64 {
	s := 0.0
	for _, x := range a {
		s += x
	}
	return s
}

// Mean returns the arithmetic mean of the elements, NaN for an empty vector.
func Mean(a Vector) float64 {
	if len(a) == 0 {
		return math.NaN()
	}
	return Sum(a) / float64(len(a))
}

// weightedMeanBlock is the number of output elements accumulated together:
// small enough that a block of the output stays in L1 across the operands.
const weightedMeanBlock = 2048

// WeightedMean returns Σₖ (wₖ/W)·vₖ with W = Σₖ wₖ: the weighted mean of
// vectors of one length, as federated averaging needs. Weights must be
// finite, non-negative and not all zero. Each output element accumulates the
// normalised terms in operand order, so the result does not depend on the
// vectors' length or on blocking.
func WeightedMean(vs []Vector, ws []float64) (Vector, error) {
	if len(vs) == 0 {
		return nil, fmt.Errorf("%w: weighted mean of no vectors", ErrShape)
	}
	if len(vs) != len(ws) {
		return nil, fmt.Errorf("%w: %d vectors but %d weights", ErrShape, len(vs), len(ws))
	}
	n := len(vs[0])
	for k, v := range vs {
		if len(v) != n {
			return nil, fmt.Errorf("%w: vector %d has length %d, vector 0 has %d", ErrShape, k, len(v), n)
		}
	}
	total := 0.0
	for k, w := range ws {
		if !(w >= 0) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("%w: weight %d is %v (weights must be finite and non-negative)", ErrWeights, k, w)
		}
		total += w
	}
	if !(total > 0) || math.IsInf(total, 0) {
		return nil, fmt.Errorf("%w: weights sum to %v", ErrWeights, total)
	}
	norm := make([]float64, len(ws))
	for k, w := range ws {
		norm[k] = w / total
	}
	out := make(Vector, n)
	for lo := 0; lo < n; lo += weightedMeanBlock {
		hi := min(lo+weightedMeanBlock, n)
		dst := out[lo:hi]
		for k, v := range vs {
			axpyUnitary(dst, norm[k], v[lo:hi])
		}
	}
	return out, nil
}

// FirstNonFinite returns the index of the first NaN or ±Inf in v, or −1.
func FirstNonFinite(v Vector) int {
	// x−x is 0 for every finite x and NaN for NaN and ±Inf: one
	// subtraction and one comparison per element. Blocks of eight keep the
	// common all-finite case free of early-exit branches.
	i := 0
	for ; i+8 <= len(v); i += 8 {
		b := v[i : i+8 : i+8]
		s := (b[0] - b[0]) + (b[1] - b[1]) + (b[2] - b[2]) + (b[3] - b[3]) +
			(b[4] - b[4]) + (b[5] - b[5]) + (b[6] - b[6]) + (b[7] - b[7])
		if s != 0 {
			break
		}
	}
	for ; i < len(v); i++ {
		if x := v[i]; x-x != 0 {
			return i
		}
	}
	return -1
}

// Equal reports whether a and b have the same length and bit-identical
// elements (so NaN equals NaN and 0 differs from −0), the replayable tier's
// notion of equality.
func Equal(a, b Vector) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}
