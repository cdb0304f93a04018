package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// logisticData draws n rows of d standard-normal features and 0/1 labels from
// a logistic model with weights w and intercept b.
func logisticData(n int, w []float64, b float64, seed uint64) *Dataset {
	r := rand.New(rand.NewPCG(seed, 1))
	d := len(w)
	x := make([]float64, n*d)
	y := make([]float64, n)
	for i := range n {
		z := b
		for j := range d {
			v := r.NormFloat64()
			x[i*d+j] = v
			z += w[j] * v
		}
		if r.Float64() < sigmoid(z) {
			y[i] = 1
		}
	}
	return &Dataset{Name: "logistic", Features: names(d), Label: "y", X: mat.NewDense(n, d, x), Y: y}
}

// classData draws n rows with labels 0..k−1 from Gaussian blobs.
func classData(n, d, k int, seed uint64) *Dataset {
	r := rand.New(rand.NewPCG(seed, 2))
	centres := make([]float64, k*d)
	for i := range centres {
		centres[i] = 2 * r.NormFloat64()
	}
	x := make([]float64, n*d)
	y := make([]float64, n)
	for i := range n {
		c := r.IntN(k)
		y[i] = float64(c)
		for j := range d {
			x[i*d+j] = centres[c*d+j] + r.NormFloat64()
		}
	}
	return &Dataset{Name: "blobs", Features: names(d), Label: "y", X: mat.NewDense(n, d, x), Y: y}
}

// linearData draws y = w·x + b + noise.
func linearData(n int, w []float64, b, noise float64, seed uint64) *Dataset {
	r := rand.New(rand.NewPCG(seed, 3))
	d := len(w)
	x := make([]float64, n*d)
	y := make([]float64, n)
	for i := range n {
		z := b
		for j := range d {
			v := r.NormFloat64()
			x[i*d+j] = v
			z += w[j] * v
		}
		y[i] = z + noise*r.NormFloat64()
	}
	return &Dataset{Name: "linear", Features: names(d), Label: "y", X: mat.NewDense(n, d, x), Y: y}
}

func names(d int) []string {
	s := make([]string, d)
	for j := range s {
		s[j] = "x" + string(rune('a'+j%26))
		if j >= 26 {
			s[j] += string(rune('0' + j/26))
		}
	}
	return s
}

func mustNew(t testing.TB, spec Spec, seed uint64) *Model {
	t.Helper()
	m, err := New(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func norm2(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}
