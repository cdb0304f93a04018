package datagen

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

func csvBytes(t *testing.T, sites []Site) [][]byte {
	t.Helper()
	var out [][]byte
	for _, s := range sites {
		var b bytes.Buffer
		if err := model.WriteCSV(&b, s.Data); err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Bytes())
	}
	return out
}

func TestDeterministic(t *testing.T) {
	gens := map[string]func(seed uint64) ([]Site, error){
		"hospitals": func(seed uint64) ([]Site, error) { return Hospitals(4, 300, seed) },
		"synthetic": func(seed uint64) ([]Site, error) { return Synthetic(1, 1, 5, seed) },
	}
	for name, gen := range gens {
		a, err := gen(7)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := gen(7)
		c, _ := gen(8)
		ab, bb, cb := csvBytes(t, a), csvBytes(t, b), csvBytes(t, c)
		for i := range ab {
			if !bytes.Equal(ab[i], bb[i]) {
				t.Errorf("%s: site %d differs between two runs with one seed", name, i)
			}
			if bytes.Equal(ab[i], cb[i]) {
				t.Errorf("%s: site %d is the same under another seed", name, i)
			}
		}
	}
}

func TestHospitalsShapeAndHeterogeneity(t *testing.T) {
	sites, err := Hospitals(5, 4000, 1)
	if err != nil {
		t.Fatal(err)
	}
	features, weights := HospitalModel()
	if len(sites) != 5 || sites[0].Name != "hospital-1" || sites[4].Name != "hospital-5" {
		t.Fatalf("sites %v", sites)
	}
	var ages, rates []float64
	for _, s := range sites {
		d := s.Data
		if d.Rows() != 4000 || !slices.Equal(d.Features, features) || d.Label != HospitalLabel {
			t.Fatalf("%s: %d rows, features %v", s.Name, d.Rows(), d.Features)
		}
		if !slices.Equal(s.Truth.Params[:len(weights)], weights) {
			t.Errorf("%s: truth weights %v", s.Name, s.Truth.Params)
		}
		lo := []float64{18, 0, 15, 85, 55, 100, 0, 0, 0}
		hi := []float64{95, 1, 60, 230, 450, 380, 1, 20, 10}
		var age, y float64
		for i := range d.Rows() {
			for j, v := range d.Row(i) {
				if v < lo[j] || v > hi[j] {
					t.Fatalf("%s row %d: %s = %v outside [%v, %v]", s.Name, i, features[j], v, lo[j], hi[j])
				}
			}
			age += d.Row(i)[0]
			y += d.Y[i]
		}
		ages = append(ages, age/4000)
		rates = append(rates, y/4000)
		if cs := d.Classes(); !slices.Equal(cs, []float64{0, 1}) {
			t.Errorf("%s: classes %v", s.Name, cs)
		}
	}
	t.Logf("mean ages %.1f, outcome rates %.3f", ages, rates)
	if ages[4]-ages[0] < 20 {
		t.Errorf("mean ages %v: sites are not heterogeneous enough", ages)
	}
	if slices.Max(rates) < 2*slices.Min(rates) || slices.Min(rates) < 0.02 || slices.Max(rates) > 0.6 {
		t.Errorf("outcome rates %v: want plausible and differing by ≥ 2×", rates)
	}
}

// TestHospitalsRecoverTruth: logistic regression on one large site finds the
// documented coefficients (trained on standardised features, mapped back).
func TestHospitalsRecoverTruth(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on 60,000 rows")
	}
	sites, err := Hospitals(1, 60000, 3)
	if err != nil {
		t.Fatal(err)
	}
	d, truth := sites[0].Data, sites[0].Truth
	s := model.FitStandardizer(d)
	m, _ := model.New(model.Spec{Kind: model.KindLogistic, Inputs: d.Dims()}, 1)
	m.Std = &s
	if _, err := model.Train(m, d, model.TrainConfig{Epochs: 8, BatchSize: 256, LR: 0.01, Optimizer: model.OptAdamW}); err != nil {
		t.Fatal(err)
	}
	b := m.Params[d.Dims()]
	for j, name := range d.Features {
		w := m.Params[j] / s.Std[j]
		b -= w * s.Mean[j]
		want := truth.Params[j]
		// Tolerance: 3 standard errors of a fit on this many rows, in
		// standardised units, plus SGD noise.
		if tol := 0.06 / s.Std[j]; math.Abs(w-want) > tol {
			t.Errorf("%s: fitted %.4f, true %.4f (± %.4f)", name, w, want, tol)
		}
	}
	if want := truth.Params[d.Dims()]; math.Abs(b-want) > 0.6 {
		t.Errorf("intercept: fitted %.3f, true %.3f", b, want)
	}
	// The truth itself scores as well as the fit.
	if mt, tt := model.Evaluate(m, d), model.Evaluate(truth, d); mt.LogLoss > tt.LogLoss+0.002 || tt.AUC < 0.7 {
		t.Errorf("fit %+v, truth %+v", mt, tt)
	}
}

func TestSynthetic(t *testing.T) {
	sites, err := Synthetic(1, 1, 30, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) != 30 || sites[0].Name != "device-01" {
		t.Fatalf("%d devices, first %q", len(sites), sites[0].Name)
	}
	var total int
	// Pooled within-device variance of x_1 and x_60 should be 1 and 60^-1.2.
	var ss1, ss60 float64
	for _, s := range sites {
		d := s.Data
		total += d.Rows()
		if d.Rows() < 50 || d.Dims() != SyntheticFeatures || d.Label != SyntheticLabel {
			t.Fatalf("%s: %d×%d", s.Name, d.Rows(), d.Dims())
		}
		for _, c := range d.Classes() {
			if c != math.Trunc(c) || c < 0 || c >= SyntheticClasses {
				t.Fatalf("%s: class %v", s.Name, c)
			}
		}
		if acc := model.Evaluate(s.Truth, d).Accuracy; acc < 0.999 {
			t.Errorf("%s: the generating model labels only %.4f of its rows", s.Name, acc)
		}
		for _, j := range []int{0, 59} {
			var mean float64
			for i := range d.Rows() {
				mean += d.Row(i)[j]
			}
			mean /= float64(d.Rows())
			for i := range d.Rows() {
				dv := d.Row(i)[j] - mean
				if j == 0 {
					ss1 += dv * dv
				} else {
					ss60 += dv * dv
				}
			}
		}
	}
	dof := float64(total - 30)
	if v := ss1 / dof; math.Abs(v-1) > 0.05 {
		t.Errorf("var(x1) = %.4f, want 1", v)
	}
	if v, want := ss60/dof, math.Pow(60, -1.2); math.Abs(v-want) > 0.05*want {
		t.Errorf("var(x60) = %.5f, want %.5f", v, want)
	}
	t.Logf("Synthetic(1,1): %d rows on 30 devices", total)

	// Heterogeneity: β shifts each device's feature means by B_k ~ N(0, β²)
	// and α each device's model by u_k ~ N(0, α²). Across devices, the
	// variance of the mean feature value is ≈ β² + 1/60 and that of the mean
	// model parameter ≈ α² + 1/610.
	iid, _ := Synthetic(0, 0, 30, 1)
	vx0, vw0 := deviceSpread(iid)
	vx1, vw1 := deviceSpread(sites)
	t.Logf("across-device variance of mean x: β=0 %.3f, β=1 %.3f; of mean W: α=0 %.4f, α=1 %.3f", vx0, vx1, vw0, vw1)
	if vx0 > 0.1 || vx1 < 0.3 || vw0 > 0.02 || vw1 < 0.3 {
		t.Error("α and β do not control heterogeneity as Synthetic(α,β) should")
	}
}

// deviceSpread returns the across-device variance of each device's mean
// feature value and of its mean true-model parameter.
func deviceSpread(sites []Site) (vx, vw float64) {
	var xs, ws []float64
	for _, s := range sites {
		xs = append(xs, mean(s.Data.X.RawMatrix().Data))
		ws = append(ws, mean(s.Truth.Params))
	}
	return variance(xs), variance(ws)
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func variance(v []float64) float64 {
	m := mean(v)
	var s float64
	for _, x := range v {
		s += (x - m) * (x - m)
	}
	return s / float64(len(v)-1)
}

func TestWriteSites(t *testing.T) {
	sites, err := Hospitals(3, 50, 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	paths, err := WriteSites(dir, sites)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(paths) != 3 || len(entries) != 3 {
		t.Fatalf("paths %v, dir holds %d entries", paths, len(entries))
	}
	for i, p := range paths {
		d, err := model.LoadCSV(p, HospitalLabel)
		if err != nil {
			t.Fatal(err)
		}
		if d.Name != sites[i].Name || !slices.Equal(d.X.RawMatrix().Data, sites[i].Data.X.RawMatrix().Data) || !slices.Equal(d.Y, sites[i].Data.Y) {
			t.Errorf("%s does not read back as written", p)
		}
	}
}

func TestBadArguments(t *testing.T) {
	calls := []func() ([]Site, error){
		func() ([]Site, error) { return Hospitals(0, 10, 1) },
		func() ([]Site, error) { return Hospitals(3, 0, 1) },
		func() ([]Site, error) { return Synthetic(-1, 1, 30, 1) },
		func() ([]Site, error) { return Synthetic(1, math.NaN(), 30, 1) },
		func() ([]Site, error) { return Synthetic(1, 1, 0, 1) },
	}
	for i, call := range calls {
		_, err := call()
		var d *diag.Diagnostic
		if !errors.As(err, &d) || d.Code != diag.InvalidValue {
			t.Errorf("call %d: %v, want %s", i, err, diag.InvalidValue)
		}
	}
}
