package tensor

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// Banded products are bit-identical to one product, and a check that fails
// stops the product.
func TestMatMulCheckedBands(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a := &Matrix{Rows: 300, Cols: 130, Data: make([]float64, 300*130)}
	b := &Matrix{Rows: 130, Cols: 70, Data: make([]float64, 130*70)}
	for i := range a.Data {
		a.Data[i] = r.NormFloat64()
	}
	for i := range b.Data {
		b.Data[i] = r.NormFloat64()
	}
	whole, err := MatMul(a, b)
	if err != nil {
		t.Fatal(err)
	}
	defer func(w int) { matMulBandWork = w }(matMulBandWork)
	matMulBandWork = 7 * 130 * 70 // bands of 7 rows
	calls, work := 0, 0
	banded, err := MatMulChecked(a, b, func(w int) error { calls++; work += w; return nil })
	if err != nil {
		t.Fatal(err)
	}
	for i := range whole.Data {
		if math.Float64bits(whole.Data[i]) != math.Float64bits(banded.Data[i]) {
			t.Fatalf("element %d differs: %v vs %v", i, whole.Data[i], banded.Data[i])
		}
	}
	if calls != (300+6)/7 || work != 300*130*70 {
		t.Fatalf("%d checks for %d multiply-adds", calls, work)
	}
	stop := errors.New("stop")
	if _, err := MatMulChecked(a, b, func(int) error { return stop }); err != stop {
		t.Fatalf("check error not returned: %v", err)
	}
}
