package model

import (
	"math/rand/v2"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// BenchmarkKernelsVsGonum alternates the plain-Go kernels with gonum's
// Gemm (assembly on amd64, what training used before) on the shapes of one
// MLP minibatch — 32 rows, 60 inputs, 64 hidden units — and reports
// plain/gonum: the price of results that match across architectures,
// against a baseline in the same run.
func BenchmarkKernelsVsGonum(b *testing.B) {
	rows, in, hidden := 32, 60, 64
	if testing.Short() {
		rows, in, hidden = 4, 6, 8
	}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64()
		}
		return v
	}
	x, w, dh := matrix(fill(rows*in), rows, in), matrix(fill(hidden*in), hidden, in), matrix(fill(rows*hidden), rows, hidden)
	h, g := matrix(make([]float64, rows*hidden), rows, hidden), matrix(make([]float64, hidden*in), hidden, in)
	var plain, viaGonum time.Duration
	for b.Loop() {
		t0 := time.Now()
		gemmNT(x, w, h)  // forward: h = x·W1ᵀ
		gemmTN(dh, x, g) // backward: ∂W1 = dhᵀ·x
		t1 := time.Now()
		blas64.Gemm(blas.NoTrans, blas.Trans, 1, x, w, 0, h)
		blas64.Gemm(blas.Trans, blas.NoTrans, 1, dh, x, 0, g)
		plain += t1.Sub(t0)
		viaGonum += time.Since(t1)
	}
	b.ReportMetric(float64(plain)/float64(viaGonum), "plain/gonum")
}
