package tensor

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func randVec(r *rand.Rand, n int) Vector {
	v := make(Vector, n)
	for i := range v {
		v[i] = r.NormFloat64()
	}
	return v
}

func TestVectorOps(t *testing.T) {
	a, b := Vector{1, 2, 3}, Vector{4, 5, 6}
	check := func(name string, got Vector, err error, want Vector) {
		t.Helper()
		if err != nil || !Equal(got, want) {
			t.Errorf("%s = %v, %v; want %v", name, got, err, want)
		}
	}
	s, err := Add(a, b)
	check("Add", s, err, Vector{5, 7, 9})
	s, err = Sub(a, b)
	check("Sub", s, err, Vector{-3, -3, -3})
	s, err = Mul(a, b)
	check("Mul", s, err, Vector{4, 10, 18})
	check("Scale", Scale(a, 2), nil, Vector{2, 4, 6})
	s, err = Axpy(2, a, b)
	check("Axpy", s, err, Vector{6, 9, 12})
	d := b.Clone()
	if err := AxpyInPlace(d, -1, a); err != nil {
		t.Fatal(err)
	}
	check("AxpyInPlace", d, nil, Vector{3, 3, 3})
	check("b unchanged", b, nil, Vector{4, 5, 6})
	if got, _ := Dot(a, b); got != 32 {
		t.Errorf("Dot = %v", got)
	}
	if got := Norm2(Vector{3, 4}); got != 5 {
		t.Errorf("Norm2 = %v", got)
	}
	if Sum(a) != 6 || Mean(a) != 2 || !math.IsNaN(Mean(nil)) {
		t.Errorf("Sum/Mean wrong")
	}
	if FirstNonFinite(Vector{1, math.Inf(1)}) != 1 || FirstNonFinite(a) != -1 {
		t.Errorf("FirstNonFinite wrong")
	}
}

func TestShapeErrors(t *testing.T) {
	a, b := Vector{1, 2}, Vector{1, 2, 3}
	for name, f := range map[string]func() error{
		"Add":          func() error { _, err := Add(a, b); return err },
		"Sub":          func() error { _, err := Sub(a, b); return err },
		"Mul":          func() error { _, err := Mul(a, b); return err },
		"Axpy":         func() error { _, err := Axpy(1, a, b); return err },
		"AxpyInPlace":  func() error { return AxpyInPlace(a, 1, b) },
		"Dot":          func() error { _, err := Dot(a, b); return err },
		"WeightedMean": func() error { _, err := WeightedMean([]Vector{a, b}, []float64{1, 1}); return err },
		"WeightsLen":   func() error { _, err := WeightedMean([]Vector{a}, []float64{1, 1}); return err },
		"NoVectors":    func() error { _, err := WeightedMean(nil, nil); return err },
		"MatMul": func() error {
			_, err := MatMul(&Matrix{2, 3, make([]float64, 6)}, &Matrix{2, 2, make([]float64, 4)})
			return err
		},
		"MatVec":   func() error { _, err := MatVec(&Matrix{2, 3, make([]float64, 6)}, a); return err },
		"Ragged":   func() error { _, err := FromRows([][]float64{{1, 2}, {3}}); return err },
		"BadData":  func() error { return (&Matrix{2, 2, []float64{1}}).Validate() },
		"Slice":    func() error { _, err := (&Matrix{2, 2, make([]float64, 4)}).Slice(0, 3, 0, 1); return err },
		"Negative": func() error { _, err := NewMatrix(-1, 2, nil); return err },
	} {
		if err := f(); !errors.Is(err, ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", name, err)
		}
	}
	for _, ws := range [][]float64{{1, -1}, {0, 0}, {math.NaN(), 1}, {math.Inf(1), 1}} {
		if _, err := WeightedMean([]Vector{a, a}, ws); !errors.Is(err, ErrWeights) {
			t.Errorf("weights %v: got %v, want ErrWeights", ws, err)
		}
	}
}

// WeightedMean against a dumb reference: same arithmetic order per element,
// so the results must be bit-identical, whatever the length (blocking).
func TestWeightedMeanReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, weightedMeanBlock - 1, weightedMeanBlock, 3*weightedMeanBlock + 5} {
		k := 1 + r.IntN(6)
		vs := make([]Vector, k)
		ws := make([]float64, k)
		for i := range vs {
			vs[i] = randVec(r, n)
			ws[i] = r.Float64() * 10
		}
		got, err := WeightedMean(vs, ws)
		if err != nil {
			t.Fatal(err)
		}
		total := 0.0
		for _, w := range ws {
			total += w
		}
		want := make(Vector, n)
		for i := range want {
			s := 0.0
			for j := range vs {
				s += float64((ws[j] / total) * vs[j][i])
			}
			want[i] = s
		}
		if !Equal(got, want) {
			t.Fatalf("n=%d: weighted mean differs from the reference", n)
		}
	}
	got, _ := WeightedMean([]Vector{{0, 2}, {4, 6}}, []float64{1, 3})
	if !Equal(got, Vector{3, 5}) {
		t.Fatalf("weighted mean = %v, want [3 5]", got)
	}
}

func naiveMatMul(a, b *Matrix) *Matrix {
	c := &Matrix{a.Rows, b.Cols, make([]float64, a.Rows*b.Cols)}
	for i := 0; i < a.Rows; i++ {
		for j := 0; j < b.Cols; j++ {
			s := 0.0
			for k := 0; k < a.Cols; k++ {
				s += a.At(i, k) * b.At(k, j)
			}
			c.Set(i, j, s)
		}
	}
	return c
}

func TestMatMulReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, d := range [][3]int{{1, 1, 1}, {3, 4, 5}, {17, 9, 33}, {70, 65, 80}, {0, 3, 2}, {2, 0, 3}} {
		a := &Matrix{d[0], d[1], randVec(r, d[0]*d[1])}
		b := &Matrix{d[1], d[2], randVec(r, d[1]*d[2])}
		got, err := MatMul(a, b)
		if err != nil {
			t.Fatal(err)
		}
		want := naiveMatMul(a, b)
		if got.Rows != want.Rows || got.Cols != want.Cols {
			t.Fatalf("%v: dims %d×%d", d, got.Rows, got.Cols)
		}
		for i := range want.Data {
			if math.Abs(got.Data[i]-want.Data[i]) > 1e-9*(1+math.Abs(want.Data[i])) {
				t.Fatalf("%v: element %d = %v, want %v", d, i, got.Data[i], want.Data[i])
			}
		}
		again, _ := MatMul(a, b)
		if !Equal(got.Data, again.Data) {
			t.Fatalf("%v: MatMul is not deterministic", d)
		}
	}
}

func TestMatrixHelpers(t *testing.T) {
	m, err := FromRows([][]float64{{1, 2, 3}, {4, 5, 6}})
	if err != nil {
		t.Fatal(err)
	}
	if m.At(1, 2) != 6 || !Equal(m.Row(1), Vector{4, 5, 6}) {
		t.Fatal("At/Row wrong")
	}
	tr := m.T()
	if tr.Rows != 3 || tr.At(2, 1) != 6 || tr.At(0, 1) != 4 {
		t.Fatalf("T wrong: %+v", tr)
	}
	s, err := m.Slice(1, 2, 1, 3)
	if err != nil || !Equal(s.Data, Vector{5, 6}) {
		t.Fatalf("Slice = %+v, %v", s, err)
	}
	v, err := MatVec(m, Vector{1, 1, 1})
	if err != nil || !Equal(v, Vector{6, 15}) {
		t.Fatalf("MatVec = %v, %v", v, err)
	}
	rows := m.ToRows()
	rows[0][0] = 99
	if m.At(0, 0) != 1 {
		t.Fatal("ToRows shares storage")
	}
	row := m.Row(0)
	row = append(row, 42) // within capacity this would write into row 1
	_ = row
	if m.At(1, 0) != 4 {
		t.Fatal("appending to a row overwrote the next row")
	}
	z, err := NewMatrix(2, 2, nil)
	if err != nil || len(z.Data) != 4 {
		t.Fatal("NewMatrix with nil data")
	}
}

func BenchmarkWeightedMean(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	vs := make([]Vector, 10)
	ws := make([]float64, 10)
	for i := range vs {
		vs[i] = randVec(r, 1_000_000)
		ws[i] = float64(i + 1)
	}
	b.SetBytes(10 * 8 * 1_000_000)
	for b.Loop() {
		if _, err := WeightedMean(vs, ws); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMatMul256(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	a := &Matrix{256, 256, randVec(r, 256*256)}
	c := &Matrix{256, 256, randVec(r, 256*256)}
	for b.Loop() {
		if _, err := MatMul(a, c); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFirstNonFinite(t *testing.T) {
	for n := 0; n < 40; n++ {
		v := make(Vector, n)
		for i := range v {
			v[i] = float64(i) - 7.5
		}
		if got := FirstNonFinite(v); got != -1 {
			t.Fatalf("n=%d finite: got %d", n, got)
		}
		for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
			for k := 0; k < n; k++ {
				w := v.Clone()
				w[k] = bad
				if k+1 < n {
					w[n-1] = bad
				}
				if got := FirstNonFinite(w); got != k {
					t.Fatalf("n=%d bad=%v at %d: got %d", n, bad, k, got)
				}
			}
		}
	}
	if FirstNonFinite(Vector{math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64}) != -1 {
		t.Fatal("extreme finite values flagged")
	}
}

func BenchmarkFirstNonFinite(b *testing.B) {
	v := randVec(rand.New(rand.NewPCG(9, 9)), 1_000_000)
	b.SetBytes(8 * 1_000_000)
	for b.Loop() {
		if FirstNonFinite(v) != -1 {
			b.Fatal("finite vector flagged")
		}
	}
}

// Sizes are checked products: a wrapped rows·cols must not validate a
// huge matrix over a small slice.
func TestSizeOverflow(t *testing.T) {
	if _, err := Size(1<<32, 1<<32); err == nil {
		t.Fatal("2^32×2^32 fits an int")
	}
	if _, err := Size(-1, 0); err == nil {
		t.Fatal("negative rows accepted")
	}
	if n, err := Size(3, 4); err != nil || n != 12 {
		t.Fatalf("3×4: %d %v", n, err)
	}
	m := &Matrix{Rows: 1 << 32, Cols: 1 << 32}
	if m.Validate() == nil {
		t.Fatal("an empty 2^32×2^32 matrix validated")
	}
	if _, err := NewMatrix(1<<40, 1<<40, []float64{}); err == nil {
		t.Fatal("NewMatrix accepted a wrapped size")
	}
	if _, err := MatMul(&Matrix{Rows: 1 << 32, Cols: 0}, &Matrix{Rows: 0, Cols: 1 << 32}); err == nil {
		t.Fatal("MatMul built a 2^32×2^32 product")
	}
}
