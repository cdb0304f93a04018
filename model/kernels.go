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
// replayable tier, docs/verification.md). For speed they work on four
// independent sums at once (four dot products, or four rows of an axpy per
// pass over the destination); that changes no element's order of
// additions. Each overwrites c (y).

// gemmNT sets c = a·bᵀ: c[i][j] = Σₖ a[i][k]·b[j][k].
func gemmNT(a, b, c blas64.General) {
	for i := range a.Rows {
		arow := a.Data[i*a.Stride : i*a.Stride+a.Cols]
		crow := c.Data[i*c.Stride : i*c.Stride+c.Cols]
		dotRows(crow, arow, b)
	}
}

// gemvN sets y = a·x: y[i] = Σₖ a[i][k]·x[k].
func gemvN(a blas64.General, x, y []float64) { dotRows(y[:a.Rows], x, a) }

// dotRows sets out[j] = Σₖ x[k]·m[j][k] for each row j of m, four rows at
// a time so the four additions chains overlap.
func dotRows(out, x []float64, m blas64.General) {
	n, s := m.Cols, m.Stride
	x = x[:n]
	j := 0
	for ; j+4 <= len(out); j += 4 {
		m0 := m.Data[j*s : j*s+n]
		m1 := m.Data[(j+1)*s : (j+1)*s+n]
		m2 := m.Data[(j+2)*s : (j+2)*s+n]
		m3 := m.Data[(j+3)*s : (j+3)*s+n]
		var s0, s1, s2, s3 float64
		for k, xk := range x {
			s0 += float64(xk * m0[k])
			s1 += float64(xk * m1[k])
			s2 += float64(xk * m2[k])
			s3 += float64(xk * m3[k])
		}
		out[j], out[j+1], out[j+2], out[j+3] = s0, s1, s2, s3
	}
	for ; j < len(out); j++ {
		mj := m.Data[j*s : j*s+n]
		var sum float64
		for k, xk := range x {
			sum += float64(xk * mj[k])
		}
		out[j] = sum
	}
}

// gemmNN sets c = a·b: c[i][j] = Σₖ a[i][k]·b[k][j], accumulated row by row
// of b so the inner loop runs over contiguous memory.
func gemmNN(a, b, c blas64.General) {
	for i := range a.Rows {
		crow := c.Data[i*c.Stride : i*c.Stride+c.Cols]
		clear(crow)
		arow := a.Data[i*a.Stride : i*a.Stride+a.Cols]
		rowsAxpy(crow, func(k int) float64 { return arow[k] }, b)
	}
}

// gemmTN sets c = aᵀ·b: c[i][j] = Σₖ a[k][i]·b[k][j].
func gemmTN(a, b, c blas64.General) {
	for i := range c.Rows {
		crow := c.Data[i*c.Stride : i*c.Stride+c.Cols]
		clear(crow)
		rowsAxpy(crow, func(k int) float64 { return a.Data[k*a.Stride+i] }, b)
	}
}

// gemvT sets y = aᵀ·x: y[j] = Σₖ a[k][j]·x[k].
func gemvT(a blas64.General, x, y []float64) {
	y = y[:a.Cols]
	clear(y)
	rowsAxpy(y, func(k int) float64 { return x[k] }, a)
}

// rowsAxpy adds Σₖ alpha(k)·m[k] to dst over the rows k of m, in
// increasing k, four rows per pass over dst.
func rowsAxpy(dst []float64, alpha func(k int) float64, m blas64.General) {
	n, s := len(dst), m.Stride
	k := 0
	for ; k+4 <= m.Rows; k += 4 {
		a0, a1, a2, a3 := alpha(k), alpha(k+1), alpha(k+2), alpha(k+3)
		m0 := m.Data[k*s : k*s+n]
		m1 := m.Data[(k+1)*s : (k+1)*s+n]
		m2 := m.Data[(k+2)*s : (k+2)*s+n]
		m3 := m.Data[(k+3)*s : (k+3)*s+n]
		for j := range dst {
			v := dst[j] + float64(a0*m0[j])
			v += float64(a1 * m1[j])
			v += float64(a2 * m2[j])
			dst[j] = v + float64(a3*m3[j])
		}
	}
	for ; k < m.Rows; k++ {
		ak := alpha(k)
		mk := m.Data[k*s : k*s+n]
		for j := range dst {
			dst[j] += float64(ak * mk[j])
		}
	}
}
