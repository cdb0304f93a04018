package dp

import (
	"math"
	"slices"
	"sync"
	"testing"
)

func TestAddGaussianMoments(t *testing.T) {
	n := newNoiseFromSeed([32]byte{7})
	const N, sigma = 200000, 2.5
	v := make([]float64, N)
	n.AddGaussian(v, sigma)
	var s, s2 float64
	for _, x := range v {
		s += x
		s2 += x * x
	}
	mean, variance := s/N, s2/N
	if math.Abs(mean) > 5*sigma/math.Sqrt(N) {
		t.Errorf("mean %v", mean)
	}
	// SE of the sample variance of a Gaussian: σ²·sqrt(2/N).
	if math.Abs(variance-sigma*sigma) > 5*sigma*sigma*math.Sqrt(2.0/N) {
		t.Errorf("variance %v, want %v", variance, sigma*sigma)
	}
}

func TestAddGaussianZeroSigma(t *testing.T) {
	v := []float64{1, 2}
	NewNoise().AddGaussian(v, 0)
	if v[0] != 1 || v[1] != 2 {
		t.Fatal("σ=0 changed v")
	}
}

func TestNoiseIsSeededFromCryptoRand(t *testing.T) {
	a, b := make([]float64, 8), make([]float64, 8)
	NewNoise().AddGaussian(a, 1)
	NewNoise().AddGaussian(b, 1)
	if slices.Equal(a, b) {
		t.Fatal("two Noise values produced the same stream")
	}
}

func TestNoiseConcurrentUse(t *testing.T) {
	n := NewNoise()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			v := make([]float64, 1000)
			n.AddGaussian(v, 1)
			n.PoissonSample(100, 0.5)
		})
	}
	wg.Wait()
}

func TestPoissonSampleRate(t *testing.T) {
	n := newNoiseFromSeed([32]byte{8})
	got := len(n.PoissonSample(100000, 0.03))
	if math.Abs(float64(got)-3000) > 5*math.Sqrt(100000*0.03*0.97) {
		t.Fatalf("sampled %d of 100000 at q=0.03", got)
	}
}

func TestNoisyClippedSum(t *testing.T) {
	n := newNoiseFromSeed([32]byte{9})
	grads := [][]float64{{3, 4}, {0.3, 0.4}}
	out := make([]float64, 2)
	if c := n.NoisyClippedSum(out, grads, 1, 0); c != 1 {
		t.Fatalf("clipped %d, want 1", c)
	}
	if math.Abs(out[0]-0.9) > 1e-12 || math.Abs(out[1]-1.2) > 1e-12 {
		t.Fatalf("sum %v, want [0.9 1.2]", out)
	}
}

func BenchmarkAddGaussian(b *testing.B) {
	n := NewNoise()
	v := make([]float64, 1<<16)
	b.SetBytes(int64(len(v) * 8))
	for b.Loop() {
		n.AddGaussian(v, 1)
	}
}
