package fl

import (
	"context"
	"math"
	"testing"

	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/script"
)

// The noise on a real client step's released update is the discrete
// Gaussian with the scale its charge implies: T = ⌈σ·√B⌉ grid units for
// the charged noise multiplier σ and the encoded update's sensitivity √B.
// Many client steps of an MLP on the same site data (same seed, so the same
// float update) give y − round(v), v the clipped update on the grid; a χ²
// test accepts the shape N_Z(0, T²) and a variance test its scale (a false
// alarm, |z| > 5, has probability below 10^-6); the variance test rejects a
// scale 5% off either way, so it cannot pass by accident.
func TestReleasedUpdateNoiseIsChargedDiscreteGaussian(t *testing.T) {
	c := builtins(t)
	env := script.Env{Catalog: c, Seed: []byte("grid-noise")}
	ctx := context.Background()
	train, _, _ := hospitalSplits(t, 1, 200, 21)
	s := load(t, c, "fedavg", map[string]any{"epochs": int64(1), "model": "mlp", "hidden": int64(16), "classes": int64(2)})
	g, err := Init(ctx, env, s, train[0].Dims())
	if err != nil {
		t.Fatal(err)
	}
	// The noiseless update the silo-level step releases: uniform weighting.
	plain, err := ClientStep(ctx, env, s.With(map[string]any{"weighting": "uniform"}), g, train[0], nil, Privacy{})
	if err != nil {
		t.Fatal(err)
	}
	const clip, sigma = 0.05, 1.3
	p := Privacy{Unit: UnitSilo, Clip: clip, Sigma: sigma}
	d := len(plain.Update)
	mech := p.UpdateMechanism(d)
	v := append([]float64(nil), plain.Update...)
	dp.ClipL2(v, clip)
	for i := range v {
		v[i] = math.Ldexp(v[i], mech.FracBits)
	}
	var noise []float64
	for rep := 0; len(noise) < 24000; rep++ {
		p.Noise = dp.NewNoise()
		out, err := ClientStep(ctx, env, s, g, train[0], nil, p)
		if err != nil {
			t.Fatal(err)
		}
		if rep == 0 {
			ms := out.Mechanism.Mechanisms
			if len(ms) != 1 || ms[0] != dp.SubsampledGaussian(sigma, 1, 1) || out.GridBits != mech.FracBits {
				t.Fatalf("charged %v on grid 2^%d", ms, out.GridBits)
			}
		}
		for i, y := range out.Encoded {
			noise = append(noise, float64(y)-math.Round(v[i]))
		}
	}
	// The charged σ and the sensitivity bound give the scale.
	B := float64(mech.Bound())
	T := math.Ceil(sigma * math.Sqrt(B))
	if got := float64(mech.NoiseScale()); got != T {
		t.Fatalf("noise scale %v, want ⌈σ√B⌉ = %v", got, T)
	}
	// Shape: a χ² test against N_Z(0, T²) in bins of T/8.
	if zz := chi2Binned(noise, T, T/8); zz > 5 {
		t.Fatalf("noise on the released update is not N_Z(0, T²), T = %v: χ² z-score %.1f over %d draws", T, zz, len(noise))
	}
	// Scale: the sample variance against T² (the discrete Gaussian's variance
	// is T² to within e^{-2π²T²}). Its standard error is T²·√(2/n), under 1%
	// at n = 24,000, so a scale 5% off (variance ±10%) sits over ten standard
	// errors away: binned χ² is the weaker test of scale and, with so few
	// draws, could not tell 0.95·T apart reliably.
	if zz := varianceZ(noise, T); math.Abs(zz) > 5 {
		t.Fatalf("noise on the released update has variance z-score %.1f against T² = %v over %d draws", zz, T*T, len(noise))
	}
	for _, f := range []float64{0.95, 1.05} {
		if zz := varianceZ(noise, f*T); math.Abs(zz) < 5 {
			t.Fatalf("the variance test cannot tell a scale of %.2f·T apart (z %.1f): it is too weak", f, zz)
		}
	}
}

// varianceZ returns the z-score of the draws' mean square (the mean is 0)
// against s², using the Gaussian fourth moment for its standard error.
func varianceZ(draws []float64, s float64) float64 {
	var m2 float64
	for _, x := range draws {
		m2 += x * x
	}
	n := float64(len(draws))
	m2 /= n
	return (m2 - s*s) / (s * s * math.Sqrt(2/n))
}

// chi2Binned returns the Wilson–Hilferty z-score of a χ² test of draws
// against N_Z(0, s²), in bins of width w (bins with expected count < 10
// pooled into one tail bin).
func chi2Binned(draws []float64, s, w float64) float64 {
	n := float64(len(draws))
	span := math.Ceil(12 * s)
	var z float64
	for x := -span; x <= span; x++ {
		z += math.Exp(-x * x / (2 * s * s))
	}
	bin := func(x float64) int { return int(math.Floor(x / w)) }
	exp := map[int]float64{}
	for x := -span; x <= span; x++ {
		exp[bin(x)] += n * math.Exp(-x*x/(2*s*s)) / z
	}
	obs := map[int]float64{}
	for _, x := range draws {
		obs[bin(x)]++
	}
	var chi2, tailE, tailO float64
	df := -1
	for b, e := range exp {
		if e < 10 {
			tailE += e
			tailO += obs[b]
		} else {
			d := obs[b] - e
			chi2 += d * d / e
			df++
		}
		delete(obs, b)
	}
	for _, o := range obs {
		tailO += o
	}
	d := tailO - tailE
	chi2 += d * d / math.Max(tailE, 1e-9)
	df++
	k := float64(df)
	return (math.Cbrt(chi2/k) - (1 - 2/(9*k))) / math.Sqrt(2/(9*k))
}
