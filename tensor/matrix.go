package tensor

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Matrix is a dense row-major matrix: element (i, j) is Data[i*Cols+j].
// A valid Matrix has Rows, Cols ≥ 0 and len(Data) == Rows*Cols.
type Matrix struct {
	Rows, Cols int
	Data       []float64
}

// Size returns rows·cols, the element count of a rows×cols matrix, or
// ErrShape when a dimension is negative or the product overflows int:
// dimensions come from content, and a wrapped product would let a huge
// matrix pass as a small one.
func Size(rows, cols int) (int, error) {
	if rows < 0 || cols < 0 {
		return 0, fmt.Errorf("%w: matrix of %d×%d", ErrShape, rows, cols)
	}
	if rows != 0 && cols > math.MaxInt/rows {
		return 0, fmt.Errorf("%w: a %d×%d matrix has more elements than an int counts", ErrShape, rows, cols)
	}
	return rows * cols, nil
}

// NewMatrix returns a rows×cols matrix over data, or over fresh zeros when
// data is nil. It does not copy data.
func NewMatrix(rows, cols int, data []float64) (*Matrix, error) {
	n, err := Size(rows, cols)
	if err != nil {
		return nil, err
	}
	if data == nil {
		data = make([]float64, n)
	}
	m := &Matrix{Rows: rows, Cols: cols, Data: data}
	return m, m.Validate()
}

// FromRows builds a matrix by copying rows of equal length.
func FromRows(rows [][]float64) (*Matrix, error) {
	if len(rows) == 0 {
		return &Matrix{}, nil
	}
	c := len(rows[0])
	m := &Matrix{Rows: len(rows), Cols: c, Data: make([]float64, 0, len(rows)*c)}
	for i, r := range rows {
		if len(r) != c {
			return nil, fmt.Errorf("%w: row %d has %d columns, row 0 has %d", ErrShape, i, len(r), c)
		}
		m.Data = append(m.Data, r...)
	}
	return m, nil
}

// Validate reports whether m's dimensions agree with its data.
func (m *Matrix) Validate() error {
	if m == nil {
		return fmt.Errorf("%w: nil matrix", ErrShape)
	}
	if n, err := Size(m.Rows, m.Cols); err != nil || len(m.Data) != n {
		return fmt.Errorf("%w: matrix of %d×%d holds %d elements", ErrShape, m.Rows, m.Cols, len(m.Data))
	}
	return nil
}

// Dims returns the number of rows and columns.
func (m *Matrix) Dims() (rows, cols int) { return m.Rows, m.Cols }

// At returns element (i, j). It panics when out of range.
func (m *Matrix) At(i, j int) float64 {
	m.check(i, j)
	return m.Data[i*m.Cols+j]
}

// Set sets element (i, j). It panics when out of range.
func (m *Matrix) Set(i, j int, v float64) {
	m.check(i, j)
	m.Data[i*m.Cols+j] = v
}

func (m *Matrix) check(i, j int) {
	if i < 0 || i >= m.Rows || j < 0 || j >= m.Cols {
		panic(fmt.Sprintf("tensor: index (%d, %d) out of range for a %d×%d matrix", i, j, m.Rows, m.Cols))
	}
}

// Row returns row i sharing m's storage (capacity clipped, so appending to
// it cannot overwrite the next row).
func (m *Matrix) Row(i int) Vector {
	if i < 0 || i >= m.Rows {
		panic(fmt.Sprintf("tensor: row %d out of range for a %d×%d matrix", i, m.Rows, m.Cols))
	}
	return Vector(m.Data[i*m.Cols : (i+1)*m.Cols : (i+1)*m.Cols])
}

// Clone returns a deep copy of m.
func (m *Matrix) Clone() *Matrix {
	return &Matrix{Rows: m.Rows, Cols: m.Cols, Data: Vector(m.Data).Clone()}
}

// ToRows returns the rows of m as fresh slices.
func (m *Matrix) ToRows() [][]float64 {
	out := make([][]float64, m.Rows)
	for i := range out {
		out[i] = append([]float64(nil), m.Data[i*m.Cols:(i+1)*m.Cols]...)
	}
	return out
}

// T returns the transpose of m as a new matrix.
func (m *Matrix) T() *Matrix {
	t := &Matrix{Rows: m.Cols, Cols: m.Rows, Data: make([]float64, len(m.Data))}
	for i := 0; i < m.Rows; i++ {
		for j := 0; j < m.Cols; j++ {
			t.Data[j*t.Cols+i] = m.Data[i*m.Cols+j]
		}
	}
	return t
}

// Slice returns a copy of the block of rows [r0, r1) and columns [c0, c1).
func (m *Matrix) Slice(r0, r1, c0, c1 int) (*Matrix, error) {
	if r0 < 0 || r1 < r0 || r1 > m.Rows || c0 < 0 || c1 < c0 || c1 > m.Cols {
		return nil, fmt.Errorf("%w: block [%d:%d, %d:%d] of a %d×%d matrix", ErrShape, r0, r1, c0, c1, m.Rows, m.Cols)
	}
	out := &Matrix{Rows: r1 - r0, Cols: c1 - c0, Data: make([]float64, 0, (r1-r0)*(c1-c0))}
	for i := r0; i < r1; i++ {
		out.Data = append(out.Data, m.Data[i*m.Cols+c0:i*m.Cols+c1]...)
	}
	return out, nil
}

// MatMul returns a·b. See the package documentation for its determinism.
func MatMul(a, b *Matrix) (*Matrix, error) { return MatMulChecked(a, b, nil) }

// MatMulChecked is MatMul that calls check, when not nil, after each band of
// rows with the multiply-adds done; a non-nil error from check stops the
// product and is returned. The result is bit-identical to MatMul's.
func MatMulChecked(a, b *Matrix, check func(work int) error) (*Matrix, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	if a.Cols != b.Rows {
		return nil, fmt.Errorf("%w: product of %d×%d and %d×%d matrices", ErrShape, a.Rows, a.Cols, b.Rows, b.Cols)
	}
	n, err := Size(a.Rows, b.Cols)
	if err != nil {
		return nil, err
	}
	c := &Matrix{Rows: a.Rows, Cols: b.Cols, Data: make([]float64, n)}
	if a.Rows == 0 || b.Cols == 0 || a.Cols == 0 {
		return c, nil
	}
	// Row bands of C, with check between them; inside a band the rows are
	// shared among the cores. Each row is computed on its own in a fixed
	// order, so neither the bands nor the goroutines change a bit.
	inner := max(a.Cols*b.Cols, 1)
	band := max(matMulBandWork/inner, 1)
	for lo := 0; lo < a.Rows; lo += band {
		hi := min(lo+band, a.Rows)
		parallelRows(lo, hi, inner, func(r0, r1 int) { matMulRows(a, b, c, r0, r1) })
		if check != nil {
			if err := check((hi - lo) * inner); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// matMulRows computes rows [r0, r1) of c = a·b. Element (i, j) is
// Σₖ a[i][k]·b[k][j] summed in increasing k from the first product, each
// product rounded by float64() so the compiler cannot fuse it into an FMA:
// the replayable tier's bits on every architecture. The loop runs over rows
// of b (contiguous memory), four at a time so each element of c is loaded
// and stored once per four products; the additions stay in k order. For
// finite operands the result equals what gonum's Dgemm gave on amd64
// (its assembly axpy rounds each product too), which MatMul used before.
func matMulRows(a, b, c *Matrix, r0, r1 int) {
	n, inner := b.Cols, a.Cols
	for i := r0; i < r1; i++ {
		crow := c.Data[i*n : (i+1)*n]
		arow := a.Data[i*inner : (i+1)*inner]
		k := 0
		for ; k+4 <= inner; k += 4 {
			a0, a1, a2, a3 := arow[k], arow[k+1], arow[k+2], arow[k+3]
			b0 := b.Data[k*n : (k+1)*n]
			b1 := b.Data[(k+1)*n : (k+2)*n]
			b2 := b.Data[(k+2)*n : (k+3)*n]
			b3 := b.Data[(k+3)*n : (k+4)*n]
			for j := range crow {
				s := crow[j] + float64(a0*b0[j])
				s += float64(a1 * b1[j])
				s += float64(a2 * b2[j])
				crow[j] = s + float64(a3*b3[j])
			}
		}
		for ; k < inner; k++ {
			axpyUnitary(crow, arow[k], b.Data[k*n:(k+1)*n])
		}
	}
}

// parallelRows runs fn over [lo, hi) split into one contiguous range per
// core, or inline when the work (rows × per-row multiply-adds) is too small
// to pay for goroutines.
func parallelRows(lo, hi, perRow int, fn func(r0, r1 int)) {
	workers := min(runtime.GOMAXPROCS(0), hi-lo)
	if workers < 2 || (hi-lo)*perRow < 1<<16 {
		fn(lo, hi)
		return
	}
	var wg sync.WaitGroup
	step := (hi - lo + workers - 1) / workers
	for r0 := lo; r0 < hi; r0 += step {
		r1 := min(r0+step, hi)
		wg.Go(func() { fn(r0, r1) })
	}
	wg.Wait()
}

// matMulBandWork is the multiply-adds MatMulChecked does between checks
// (about a tenth of a second).
var matMulBandWork = 1 << 27 // a variable so tests can make bands small

// MatVec returns a·x, each element summed in column order (replayable).
func MatVec(a *Matrix, x Vector) (Vector, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if a.Cols != len(x) {
		return nil, fmt.Errorf("%w: product of a %d×%d matrix and a vector of length %d", ErrShape, a.Rows, a.Cols, len(x))
	}
	out := make(Vector, a.Rows)
	for i := range out {
		out[i] = dot(a.Row(i), x)
	}
	return out, nil
}
