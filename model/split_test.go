package model

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
)

// tagged returns a dataset whose first feature is the row index, so subsets
// can be traced back.
func tagged(n int, classes int) *Dataset {
	d := classData(n, 2, classes, 1)
	for i := range n {
		d.X.Set(i, 0, float64(i))
	}
	return d
}

func ids(d *Dataset) []int {
	out := make([]int, d.Rows())
	for i := range out {
		out[i] = int(d.X.At(i, 0))
	}
	return out
}

func TestSplit(t *testing.T) {
	d := tagged(101, 2)
	train, test, err := Split(d, 0.2, 7)
	if err != nil {
		t.Fatal(err)
	}
	if test.Rows() != 20 || train.Rows() != 81 {
		t.Fatalf("sizes %d/%d", train.Rows(), test.Rows())
	}
	all := append(ids(train), ids(test)...)
	slices.Sort(all)
	if !slices.Equal(all, identity(101)) {
		t.Error("train and test do not partition the rows")
	}
	if !slices.IsSorted(ids(train)) || !slices.IsSorted(ids(test)) {
		t.Error("rows not kept in file order")
	}
	_, test2, _ := Split(d, 0.2, 7)
	_, test3, _ := Split(d, 0.2, 8)
	if !slices.Equal(ids(test), ids(test2)) || slices.Equal(ids(test), ids(test3)) {
		t.Error("split is not a function of the seed")
	}
	for _, frac := range []float64{0, 1, -0.1, math.NaN()} {
		if _, _, err := Split(d, frac, 1); err == nil {
			t.Errorf("fraction %v accepted", frac)
		}
	}
	var dg *diag.Diagnostic
	if _, _, err := Split(tagged(1, 1), 0.5, 1); !errors.As(err, &dg) || dg.Code != diag.DatasetTooSmall {
		t.Errorf("one row: %v", err)
	}
}

func TestKFold(t *testing.T) {
	for _, stratify := range []bool{false, true} {
		d := tagged(103, 3)
		seen := make([]int, d.Rows())
		for fold := range 5 {
			train, test, err := KFold(d, 5, fold, 11, stratify)
			if err != nil {
				t.Fatal(err)
			}
			if train.Rows()+test.Rows() != 103 || test.Rows() < 20 || test.Rows() > 21 {
				t.Errorf("fold %d sizes %d/%d", fold, train.Rows(), test.Rows())
			}
			for _, i := range ids(test) {
				seen[i]++
			}
			if stratify {
				// each class within ±1 of its share
				for _, c := range d.Classes() {
					var all, in float64
					for _, y := range d.Y {
						if y == c {
							all++
						}
					}
					for _, y := range test.Y {
						if y == c {
							in++
						}
					}
					if math.Abs(in-all/5) > 1 {
						t.Errorf("fold %d class %v: %v of %v", fold, c, in, all)
					}
				}
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("stratify=%v: row %d is in %d test folds", stratify, i, n)
			}
		}
	}
	var dg *diag.Diagnostic
	if _, _, err := KFold(tagged(3, 1), 5, 0, 1, false); !errors.As(err, &dg) || dg.Code != diag.DatasetTooSmall {
		t.Errorf("3 rows in 5 folds: %v", err)
	}
	for _, kf := range [][2]int{{1, 0}, {5, 5}, {5, -1}} {
		if _, _, err := KFold(tagged(30, 2), kf[0], kf[1], 1, false); err == nil {
			t.Errorf("k=%d fold=%d accepted", kf[0], kf[1])
		}
	}
}

func TestStandardizer(t *testing.T) {
	d := classData(500, 3, 2, 4)
	d.X.Set(0, 2, 0)
	for i := range d.Rows() {
		d.X.Set(i, 2, 7) // constant column
	}
	train, test, _ := Split(d, 0.3, 1)
	s := FitStandardizer(train)
	st := s.Apply(train)
	for j := range 2 {
		var mean, sq float64
		for i := range st.Rows() {
			mean += st.X.At(i, j)
		}
		mean /= float64(st.Rows())
		for i := range st.Rows() {
			sq += (st.X.At(i, j) - mean) * (st.X.At(i, j) - mean)
		}
		if math.Abs(mean) > 1e-12 || math.Abs(sq/float64(st.Rows())-1) > 1e-12 {
			t.Errorf("feature %d: mean %g var %g", j, mean, sq/float64(st.Rows()))
		}
	}
	if s.Std[2] != 1 || st.X.At(0, 2) != 0 {
		t.Errorf("constant feature: std %v value %v", s.Std[2], st.X.At(0, 2))
	}
	before := test.X.At(0, 0)
	_ = s.Apply(test)
	if test.X.At(0, 0) != before {
		t.Error("Apply modified its input")
	}
}
