package tensor

import (
	"math/rand/v2"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// BenchmarkMatMulVsGonum alternates MatMul (plain Go, the same bits on
// every architecture) with gonum's Dgemm (assembly on amd64, what MatMul
// used before) on the same operands, and reports plain/gonum: the price of
// replayability across architectures, against a baseline in the same run.
// It also checks that the two agree bit for bit where gonum's kernels do
// not fuse multiply-adds (amd64).
func BenchmarkMatMulVsGonum(b *testing.B) {
	n := 256
	if testing.Short() {
		n = 32
	}
	r := rand.New(rand.NewPCG(7, 8))
	a := &Matrix{n, n, randVec(r, n*n)}
	c := &Matrix{n, n, randVec(r, n*n)}
	general := func(m *Matrix) blas64.General {
		return blas64.General{Rows: m.Rows, Cols: m.Cols, Stride: m.Cols, Data: m.Data}
	}
	ref := &Matrix{n, n, make([]float64, n*n)}
	var plain, viaGonum time.Duration
	for b.Loop() {
		t0 := time.Now()
		got, err := MatMul(a, c)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		blas64.Gemm(blas.NoTrans, blas.NoTrans, 1, general(a), general(c), 0, general(ref))
		plain += t1.Sub(t0)
		viaGonum += time.Since(t1)
		if gonumDoesNotFuse && !Equal(got.Data, ref.Data) {
			b.Fatal("MatMul differs from gonum's Dgemm on amd64")
		}
	}
	b.ReportMetric(float64(plain)/float64(viaGonum), "plain/gonum")
}
