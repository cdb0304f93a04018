package model

import "gonum.org/v1/gonum/blas/blas64"

// The matrix kernels of training and evaluation, in plain Go. They replace
// gonum's Gemm and Gemv, whose amd64 kernels are assembly that sums in
// another order than its pure-Go kernels on arm64 (where the compiler also
// fuses multiply-adds): with gonum, one training shard gave other bits on
// arm64 than on amd64, and replicas on mixed machines never agreed. Here
// every element is a sum over the inner index in increasing order, starting
// from the first product, and every product is rounded by float64() so no
// compiler may fuse it: the same bits on every architecture (the
// replayable tier, docs/verification.md). Each overwrites c (y).

// gemmNT sets c = a·bᵀ: c[i][j] = Σₖ a[i][k]·b[j][k].
func gemmNT(a, b, c blas64.General) {
	for i := range a.Rows {
		arow := a.Data[i*a.Stride : i*a.Stride+a.Cols]
		crow := c.Data[i*c.Stride : i*c.Stride+c.Cols]
		for j := range crow {
			crow[j] = dotRounded(arow, b.Data[j*b.Stride:j*b.Stride+b.Cols])
		}
	}
}

// gemmNN sets c = a·b: c[i][j] = Σₖ a[i][k]·b[k][j], accumulated row by row
// of b so the inner loop runs over contiguous memory.
func gemmNN(a, b, c blas64.General) {
	for i := range a.Rows {
		arow := a.Data[i*a.Stride : i*a.Stride+a.Cols]
		crow := c.Data[i*c.Stride : i*c.Stride+c.Cols]
		clear(crow)
		for k, aik := range arow {
			axpyRounded(crow, aik, b.Data[k*b.Stride:k*b.Stride+b.Cols])
		}
	}
}

// gemmTN sets c = aᵀ·b: c[i][j] = Σₖ a[k][i]·b[k][j].
func gemmTN(a, b, c blas64.General) {
	for i := range c.Rows {
		clear(c.Data[i*c.Stride : i*c.Stride+c.Cols])
	}
	for k := range a.Rows {
		arow := a.Data[k*a.Stride : k*a.Stride+a.Cols]
		brow := b.Data[k*b.Stride : k*b.Stride+b.Cols]
		for i, aki := range arow {
			axpyRounded(c.Data[i*c.Stride:i*c.Stride+c.Cols], aki, brow)
		}
	}
}

// gemvN sets y = a·x: y[i] = Σₖ a[i][k]·x[k].
func gemvN(a blas64.General, x, y []float64) {
	for i := range a.Rows {
		y[i] = dotRounded(a.Data[i*a.Stride:i*a.Stride+a.Cols], x)
	}
}

// gemvT sets y = aᵀ·x: y[j] = Σₖ a[k][j]·x[k].
func gemvT(a blas64.General, x, y []float64) {
	y = y[:a.Cols]
	clear(y)
	for k := range a.Rows {
		axpyRounded(y, x[k], a.Data[k*a.Stride:k*a.Stride+a.Cols])
	}
}

func dotRounded(a, b []float64) float64 {
	b = b[:len(a)]
	s := 0.0
	for k, v := range a {
		s += float64(v * b[k])
	}
	return s
}

// axpyRounded sets dst += alpha·x.
func axpyRounded(dst []float64, alpha float64, x []float64) {
	x = x[:len(dst)]
	for j, v := range x {
		dst[j] += float64(alpha * v)
	}
}
