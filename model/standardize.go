package model

import (
	"math"

	"gonum.org/v1/gonum/mat"
)

// Standardizer maps each feature to zero mean and unit variance:
// x'_j = (x_j − Mean[j]) / Std[j]. Fit it on training data only and apply the
// same Standardizer to test data, so no test statistic leaks into training.
type Standardizer struct {
	Mean, Std []float64
}

// FitStandardizer computes per-feature means and population standard
// deviations of d. A constant feature gets Std 1, so it maps to 0 rather than
// dividing by zero.
func FitStandardizer(d *Dataset) Standardizer {
	c := d.Dims()
	s := Standardizer{Mean: make([]float64, c), Std: make([]float64, c)}
	n := d.Rows()
	if n == 0 {
		for j := range s.Std {
			s.Std[j] = 1
		}
		return s
	}
	for i := range n {
		for j, v := range d.X.RawRowView(i) {
			s.Mean[j] += v
		}
	}
	for j := range s.Mean {
		s.Mean[j] /= float64(n)
	}
	for i := range n {
		for j, v := range d.X.RawRowView(i) {
			dv := v - s.Mean[j]
			s.Std[j] += float64(dv * dv)
		}
	}
	for j := range s.Std {
		sd := math.Sqrt(s.Std[j] / float64(n))
		if !(sd > 1e-12*math.Max(1, math.Abs(s.Mean[j]))) {
			sd = 1
		}
		s.Std[j] = sd
	}
	return s
}

// Apply returns a standardised copy of d; d is unchanged. It panics if d has
// a different number of features than s was fitted on.
func (s Standardizer) Apply(d *Dataset) *Dataset {
	out := d.Subset(nil)
	out.Y = append([]float64(nil), d.Y...)
	if d.Rows() == 0 {
		return out
	}
	n, c := d.Rows(), d.Dims()
	if c != len(s.Mean) {
		panic("model: Standardizer fitted on a different number of features")
	}
	data := make([]float64, n*c)
	for i := range n {
		s.applyRow(data[i*c:(i+1)*c], d.X.RawRowView(i))
	}
	out.X = mat.NewDense(n, c, data)
	return out
}

// applyRow writes the standardised x into dst (which may alias x).
func (s Standardizer) applyRow(dst, x []float64) {
	for j, v := range x {
		dst[j] = (v - s.Mean[j]) / s.Std[j]
	}
}
