package model

import (
	"math"
	"slices"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// TestDPSGDClipsPerExample: every example gradient that enters the sum has
// L2 norm at most C, and clipping is active (some raw norms exceed C).
func TestDPSGDClipsPerExample(t *testing.T) {
	for _, tc := range gradCases {
		m := mustNew(t, tc.spec, 1)
		randomParams(m, 2)
		const clip = 0.05
		tr, err := newTrainer(m, tc.data(), TrainConfig{LR: 0.1, DP: &DPSGD{Q: 0.3, Clip: clip, Sigma: 1, Steps: 20}})
		if err != nil {
			t.Fatal(err)
		}
		var seen, clipped int
		tr.dp.onClipped = func(g []float64, raw float64) {
			seen++
			if raw > clip {
				clipped++
			}
			// dp.ClipL2 guarantees the bound in its own (scaled) norm; a
			// naive sum of squares may round a few ulps differently.
			if n := norm2(g); n > clip*(1+1e-14) {
				t.Fatalf("%s: clipped gradient has norm %.17g > C = %g", tc.spec.Kind, n, clip)
			}
		}
		if _, err := tr.run(); err != nil {
			t.Fatal(err)
		}
		if seen == 0 || clipped == 0 {
			t.Errorf("%s: %d example gradients, %d clipped: the test exercised nothing", tc.spec.Kind, seen, clipped)
		}
	}
}

// TestDPSGDPoissonRate: batch sizes follow Binomial(n, q).
func TestDPSGDPoissonRate(t *testing.T) {
	d := logisticData(2000, []float64{1, -1}, 0, 3)
	m := mustNew(t, Spec{Kind: KindLogistic, Inputs: 2}, 1)
	const q, steps = 0.05, 200
	st, err := Train(m, d, TrainConfig{LR: 0.1, DP: &DPSGD{Q: q, Clip: 1, Sigma: 1, Steps: steps}})
	if err != nil {
		t.Fatal(err)
	}
	mean := q * 2000 * steps
	sd := math.Sqrt(2000 * steps * q * (1 - q))
	if st.Steps != steps || math.Abs(float64(st.Examples)-mean) > 6*sd {
		t.Errorf("%d steps, %d examples; want %d steps, %.0f ± %.0f examples", st.Steps, st.Examples, steps, mean, 6*sd)
	}
}

// TestDPSGDNoiseScale: with every example gradient zero, one SGD step moves
// the parameters by exactly −LR·noise/(q·n), and the noise has standard
// deviation σ·C per coordinate.
func TestDPSGDNoiseScale(t *testing.T) {
	const n, dims = 100, 4000
	d := &Dataset{Name: "zero", X: mat.NewDense(n, dims, nil), Y: make([]float64, n)} // y = ŷ = 0
	m := mustNew(t, Spec{Kind: KindLinear, Inputs: dims}, 1)
	const q, clip, sigma, lr = 0.1, 2.0, 1.5, 1.0
	if _, err := Train(m, d, TrainConfig{LR: lr, DP: &DPSGD{Q: q, Clip: clip, Sigma: sigma, Steps: 1}}); err != nil {
		t.Fatal(err)
	}
	var ss float64
	for _, v := range m.Params {
		noise := -v * q * n / lr
		ss += noise * noise
	}
	got := math.Sqrt(ss / float64(len(m.Params)))
	if want := sigma * clip; math.Abs(got-want) > 0.05*want {
		t.Errorf("noise std %.4f, want σC = %.4f", got, want)
	}
}

// TestDPSGDLearnsAndIsRandom: DP-SGD with moderate noise still learns, and
// two runs differ (sampling and noise are not seeded).
func TestDPSGDLearnsAndIsRandom(t *testing.T) {
	d := logisticData(5000, []float64{2, -2, 1}, 0, 4)
	cfg := TrainConfig{LR: 0.5, Seed: 1, DP: &DPSGD{Q: 0.02, Clip: 1, Sigma: 1, Steps: 300}}
	var runs [][]float64
	for range 2 {
		m := mustNew(t, Spec{Kind: KindLogistic, Inputs: 3}, 1)
		if _, err := Train(m, d, cfg); err != nil {
			t.Fatal(err)
		}
		if acc := Evaluate(m, d).Accuracy; acc < 0.8 {
			t.Errorf("DP-SGD accuracy %.3f, want ≥ 0.8", acc)
		}
		runs = append(runs, m.Params)
	}
	if slices.Equal(runs[0], runs[1]) {
		t.Error("two DP-SGD runs gave identical parameters: noise or sampling is not random")
	}
}

// TestTrainStepDoesNotAllocate: the minibatch hot loop allocates nothing.
func TestTrainStepDoesNotAllocate(t *testing.T) {
	for _, tc := range gradCases {
		d := tc.data()
		m := mustNew(t, tc.spec, 1)
		tr, err := newTrainer(m, d, TrainConfig{Epochs: 1, BatchSize: 8, LR: 0.01, Optimizer: OptAdamW, Mu: 0.1, Anchor: make([]float64, len(m.Params))})
		if err != nil {
			t.Fatal(err)
		}
		batch := []int{3, 1, 4, 1, 5, 9, 2, 6}
		if a := testing.AllocsPerRun(50, func() { tr.minibatch(batch) }); a != 0 {
			t.Errorf("%s: %v allocations per minibatch step", tc.spec.Kind, a)
		}
		dtr, err := newTrainer(m, d, TrainConfig{LR: 0.01, DP: &DPSGD{Q: 0.3, Clip: 1, Sigma: 1, Steps: 1}})
		if err != nil {
			t.Fatal(err)
		}
		dtr.dpStep() // grows the sample buffer once
		if a := testing.AllocsPerRun(50, func() { dtr.dpStep() }); a != 0 {
			t.Errorf("%s: %v allocations per DP-SGD step", tc.spec.Kind, a)
		}
	}
}

// TestPoissonSampleInclusion: every example is included with probability q,
// whatever its position (the geometric-gap sampler has no edge effects), and
// inclusions are independent (the sample size has binomial variance).
func TestPoissonSampleInclusion(t *testing.T) {
	s := newDPState(1, 50)
	const n, trials = 50, 40000
	for _, q := range []float64{0.02, 0.3, 0.9, 1} {
		counts := make([]int, n)
		var sum, sumSq float64
		var idx []int
		for range trials {
			idx = s.poissonSample(idx[:0], n, q)
			for k, i := range idx {
				if k > 0 && i <= idx[k-1] || i < 0 || i >= n {
					t.Fatalf("q=%v: sample %v not increasing within [0,%d)", q, idx, n)
				}
				counts[i]++
			}
			sum += float64(len(idx))
			sumSq += float64(len(idx) * len(idx))
		}
		sd := math.Sqrt(trials * q * (1 - q))
		for i, c := range counts {
			if math.Abs(float64(c)-trials*q) > 5*sd+1e-9 {
				t.Errorf("q=%v: example %d included %d times, want %.0f ± %.0f", q, i, c, trials*q, 5*sd)
			}
		}
		mean := sum / trials
		variance := sumSq/trials - mean*mean
		if want := n * q * (1 - q); math.Abs(variance-want) > 0.05*want+1e-9 {
			t.Errorf("q=%v: sample size variance %.3f, want %.3f", q, variance, want)
		}
	}
}
