package dp

import (
	crand "crypto/rand"
	"math"
	"math/rand/v2"
	"sync"
)

// Noise draws differential-privacy noise from a cryptographically secure
// generator: a ChaCha8 stream (math/rand/v2) whose 32-byte key is read from
// crypto/rand when the Noise is created. It never uses a non-cryptographic
// source (PCG, the global math/rand).
//
// A Noise is safe for concurrent use by multiple goroutines; calls are
// serialised by an internal mutex, so goroutines that each need a high noise
// rate should each create their own with NewNoise.
//
// Floating-point caveat (Mironov, CCS 2012): a Gaussian sample formed in
// float64 arithmetic does not have the exact distribution assumed by the
// proof, and the set of floats reachable from a given noiseless value can
// reveal it through the low-order bits of the noised result. AddGaussian is
// the path for local model training only (DP-SGD's noised gradients, which
// the optimiser transforms inside the silo), where this residual risk is
// accepted and documented in docs/dp.md. Anything a silo releases is noised
// on the integer grid secure aggregation sums on, with the exact discrete
// Gaussian (GridGaussian, ReleaseOnGrid); a test keeps float noise off the
// round path.
type Noise struct {
	mu  sync.Mutex
	src *rand.ChaCha8
	rng *rand.Rand
}

// NewNoise returns a Noise keyed from crypto/rand. It panics if the operating
// system's randomness source fails, since no safe fallback exists.
func NewNoise() *Noise {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		panic("dp: crypto/rand failed: " + err.Error())
	}
	return newNoiseFromSeed(seed)
}

// newNoiseFromSeed is for tests that need a reproducible stream.
func newNoiseFromSeed(seed [32]byte) *Noise {
	src := rand.NewChaCha8(seed)
	return &Noise{src: src, rng: rand.New(src)}
}

// AddGaussian adds independent N(0, sigma²) noise to every element of v, in
// place. For DP-SGD sigma is the noise multiplier times the clipping bound.
// sigma must be non-negative and finite; AddGaussian panics otherwise. A zero
// sigma leaves v unchanged.
func (n *Noise) AddGaussian(v []float64, sigma float64) {
	if !(sigma >= 0) || math.IsInf(sigma, 0) {
		panic("dp: gaussian sigma must be non-negative and finite")
	}
	if sigma == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range v {
		v[i] += sigma * n.rng.NormFloat64()
	}
}

// Uint64 returns a uniformly random 64-bit value from the same secure stream
// (used, for example, for Poisson sampling decisions).
func (n *Noise) Uint64() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.src.Uint64()
}

// Float64 returns a uniform value in [0, 1) from the secure stream.
func (n *Noise) Float64() float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.Float64()
}

// PoissonSample returns, for a population of size n, the indices of the
// members included by independent Bernoulli(q) draws from the secure stream.
// This is the sampling the RDP accountant's subsampled Gaussian assumes: the
// batch size is random, not fixed.
func (n *Noise) PoissonSample(size int, q float64) []int {
	if !(q >= 0 && q <= 1) {
		panic("dp: sampling rate must be in [0, 1]")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []int
	for i := 0; i < size; i++ {
		if n.rng.Float64() < q {
			out = append(out, i)
		}
	}
	return out
}

// uint64n returns a uniform integer in [0, n), n > 0, exactly (no modulo
// bias: rand.Rand's Uint64N uses Lemire's unbiased method).
func (n *Noise) uint64n(k uint64) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.Uint64N(k)
}

// read fills p with bytes from the secure stream.
func (n *Noise) read(p []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.src.Read(p)
}
