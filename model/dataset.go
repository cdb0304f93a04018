package model

import (
	"fmt"
	"slices"

	"gonum.org/v1/gonum/mat"
)

// Dataset is a table of numeric features and one label per row.
//
// X is Rows()×Dims(); a dataset with no rows has X == nil (gonum matrices
// cannot be empty). Y holds one label per row: a 0/1 or 0..K−1 class for
// classification, any real number for regression.
type Dataset struct {
	Name     string
	Features []string
	Label    string
	X        *mat.Dense // n×d
	Y        []float64
}

// Rows returns the number of rows.
func (d *Dataset) Rows() int { return len(d.Y) }

// Dims returns the number of features per row.
func (d *Dataset) Dims() int {
	if d.X != nil {
		_, c := d.X.Dims()
		return c
	}
	return len(d.Features)
}

// Row returns row i of X (shared storage, not a copy).
func (d *Dataset) Row(i int) []float64 {
	return d.X.RawRowView(i)
}

// Subset returns a new dataset holding copies of rows idx, in that order.
// An index may repeat (bootstrap samples). It panics on an index out of range.
func (d *Dataset) Subset(idx []int) *Dataset {
	out := &Dataset{
		Name:     d.Name,
		Features: slices.Clone(d.Features),
		Label:    d.Label,
		Y:        make([]float64, len(idx)),
	}
	if len(idx) == 0 {
		return out
	}
	c := d.Dims()
	data := make([]float64, len(idx)*c)
	for k, i := range idx {
		if i < 0 || i >= d.Rows() {
			panic(fmt.Sprintf("model: Subset index %d out of range [0,%d)", i, d.Rows()))
		}
		copy(data[k*c:(k+1)*c], d.X.RawRowView(i))
		out.Y[k] = d.Y[i]
	}
	out.X = mat.NewDense(len(idx), c, data)
	return out
}

// Classes returns the distinct labels in increasing order.
func (d *Dataset) Classes() []float64 {
	cs := slices.Clone(d.Y)
	slices.Sort(cs)
	return slices.Compact(cs)
}

// check reports a dataset whose parts disagree (a programming error in a
// caller that built it by hand) as an error rather than a panic deep in BLAS.
func (d *Dataset) check() error {
	if d == nil {
		return fmt.Errorf("model: nil dataset")
	}
	if d.X == nil {
		if len(d.Y) != 0 {
			return fmt.Errorf("model: dataset %q has %d labels but no feature matrix", d.Name, len(d.Y))
		}
		return nil
	}
	r, c := d.X.Dims()
	if r != len(d.Y) {
		return fmt.Errorf("model: dataset %q has %d rows but %d labels", d.Name, r, len(d.Y))
	}
	if d.Features != nil && len(d.Features) != c {
		return fmt.Errorf("model: dataset %q has %d columns but %d feature names", d.Name, c, len(d.Features))
	}
	return nil
}
