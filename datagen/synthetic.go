package datagen

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// Shape of Synthetic(α, β), as in Li et al. 2020.
const (
	SyntheticFeatures = 60
	SyntheticClasses  = 10
	// SyntheticLabel is the label column of Synthetic data.
	SyntheticLabel = "y"
	// maxDeviceRows caps one device's sample count (a guard against the
	// lognormal's far tail; reached with probability below 1e-4 per device).
	maxDeviceRows = 1 << 20
	maxDevices    = 10000
)

// Synthetic generates FedProx's Synthetic(α, β) federated dataset (Li et al.,
// "Federated Optimization in Heterogeneous Networks", MLSys 2020, §5.1 and
// their generate_synthetic.py), one Site per device, named device-1 … device-N
// (zero-padded). The paper uses 30 devices.
//
// For device k: the sample count is ⌊exp(N(4, 2²))⌋ + 50; the model is
// y = argmax softmax(W_k x + b_k) with W_k[c][j], b_k[c] ~ N(u_k, 1) and
// u_k ~ N(0, α²); features are x ~ N(v_k, Σ) with Σ diagonal, Σ_jj = j^−1.2
// (j = 1..60), v_k[j] ~ N(B_k, 1) and B_k ~ N(0, β²). α controls how much the
// local models differ, β how much the local data differ. As in the reference
// code, α and β are standard deviations (the paper's N(0, α) reads as a
// variance; the two agree at α = β = 1 and at 0).
//
// Features are rounded to four decimals and labels computed from the rounded
// values; Site.Truth holds each device's (W_k, b_k) as a softmax model. Rows
// per device are capped at 2^20.
func Synthetic(alpha, beta float64, devices int, seed uint64) ([]Site, error) {
	for _, p := range []struct {
		name string
		v    float64
	}{{"alpha", alpha}, {"beta", beta}} {
		if !(p.v >= 0) || math.IsInf(p.v, 0) {
			return nil, diag.New(diag.InvalidValue, "datagen synthetic", "%s = %v must be a finite number ≥ 0", p.name, p.v).
				WithHelp("the paper uses Synthetic(0,0), (0.5,0.5) and (1,1)")
		}
	}
	if devices < 1 || devices > maxDevices {
		return nil, diag.New(diag.InvalidValue, "datagen synthetic", "number of devices %d is outside 1..%d", devices, maxDevices).
			WithHelp("the paper uses 30 devices")
	}
	const d, k = SyntheticFeatures, SyntheticClasses
	// One stream for every (α, β): under one seed, Synthetic(0,0) and
	// Synthetic(1,1) share sample counts and underlying standard normals and
	// differ only in the heterogeneity α and β scale in.
	r := newRand(seed, "synthetic")

	// Draw order follows generate_synthetic.py: sample counts, u_k (mean_W,
	// also mean_b), B_k, then v_k; then per device W_k, b_k and its rows.
	counts := make([]int, devices)
	for i := range counts {
		c := math.Floor(math.Exp(normal(r, 4, 2)))
		counts[i] = int(math.Min(c, maxDeviceRows-50)) + 50
	}
	u := make([]float64, devices)
	for i := range u {
		u[i] = normal(r, 0, alpha)
	}
	bigB := make([]float64, devices)
	for i := range bigB {
		bigB[i] = normal(r, 0, beta)
	}
	v := make([][]float64, devices)
	for i := range v {
		v[i] = make([]float64, d)
		for j := range v[i] {
			v[i][j] = normal(r, bigB[i], 1)
		}
	}
	sd := make([]float64, d)
	for j := range sd {
		sd[j] = math.Sqrt(math.Pow(float64(j+1), -1.2))
	}
	features := make([]string, d)
	for j := range features {
		features[j] = fmt.Sprintf("x%d", j+1)
	}

	out := make([]Site, devices)
	for dev := range devices {
		// Truth in the canonical softmax layout: W[c][j] at c*d+j, then b.
		params := make([]float64, k*d+k)
		for j := range d { // the reference draws W as d×k, row by row
			for c := range k {
				params[c*d+j] = normal(r, u[dev], 1)
			}
		}
		for c := range k {
			params[k*d+c] = normal(r, u[dev], 1)
		}
		n := counts[dev]
		x := make([]float64, n*d)
		y := make([]float64, n)
		logits := make([]float64, k)
		for i := range n {
			row := x[i*d : (i+1)*d]
			for j := range row {
				row[j] = round(normal(r, v[dev][j], sd[j]), 4)
			}
			for c := range k {
				z := params[k*d+c]
				for j, xv := range row {
					z += params[c*d+j] * xv
				}
				logits[c] = z
			}
			best := 0
			for c, z := range logits {
				if z > logits[best] {
					best = c
				}
			}
			y[i] = float64(best)
		}
		name := siteName("device", dev, devices)
		out[dev] = Site{
			Name: name,
			Data: &model.Dataset{
				Name:     name,
				Features: slices.Clone(features),
				Label:    SyntheticLabel,
				X:        mat.NewDense(n, d, x),
				Y:        y,
			},
			Truth: &model.Model{
				Spec:   model.Spec{Kind: model.KindSoftmax, Inputs: d, Classes: k},
				Params: params,
			},
		}
	}
	return out, nil
}
