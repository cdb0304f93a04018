package dp

import (
	"fmt"
	"math"
	"math/big"
	"sync"
)

// DiscreteGaussian samples exactly from the discrete Gaussian distribution
// N_Z(0, σ²) on the integers, P[X = x] ∝ exp(−x²/(2σ²)), with the algorithm
// of Canonne, Kamath and Steinke ("The Discrete Gaussian for Differential
// Privacy", NeurIPS 2020, Algorithms 1–3): rejection sampling from a discrete
// Laplace, where every Bernoulli trial has a rational success probability and
// is decided by exact integer comparisons on uniform integers from the secure
// stream. No floating-point number takes part in sampling, so the output
// distribution is exactly the one the privacy proof assumes and its bits do
// not leak the input (Mironov 2012).
//
// Use it for noise added on an integer or fixed-point grid — the encoding
// secure aggregation sums in. A DiscreteGaussian is safe for concurrent use
// (calls are serialised).
type DiscreteGaussian struct {
	mu    sync.Mutex
	src   *Noise
	num   *big.Int // σ² = num/den, in lowest terms
	den   *big.Int
	t     *big.Int // floor(σ) + 1, the Laplace scale
	tU64  uint64
	sigma float64 // for String only

	// scratch
	a, b, c, d *big.Int
	buf        []byte
}

// NewDiscreteGaussian returns a sampler for N_Z(0, σ²) drawing its randomness
// from src (NewNoise() if src is nil). σ is taken exactly: σ² is the exact
// rational value of the float64 product sigma·sigma rounded up to the next
// multiple of 2^-32, which can only add noise. sigma must be positive, finite
// and below 2^40.
func NewDiscreteGaussian(sigma float64, src *Noise) (*DiscreteGaussian, error) {
	if err := checkSigma(sigma); err != nil {
		return nil, err
	}
	if sigma >= 1<<40 {
		return nil, fmt.Errorf("dp: discrete gaussian σ=%g is too large", sigma)
	}
	// σ² rounded up to a multiple of 2^-32: num/2^32 ≥ sigma².
	exact := new(big.Rat).SetFloat64(sigma)
	exact.Mul(exact, exact)
	scaled := new(big.Rat).Mul(exact, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 32)))
	num := new(big.Int).Quo(scaled.Num(), scaled.Denom())
	if new(big.Rat).SetInt(num).Cmp(scaled) < 0 {
		num.Add(num, big.NewInt(1))
	}
	s2 := new(big.Rat).SetFrac(num, new(big.Int).Lsh(big.NewInt(1), 32))
	g, err := NewDiscreteGaussianRat(s2, src)
	if err != nil {
		return nil, err
	}
	g.sigma = sigma
	return g, nil
}

// NewDiscreteGaussianRat returns a sampler for N_Z(0, σ²) with σ² given as
// an exact positive rational.
func NewDiscreteGaussianRat(sigma2 *big.Rat, src *Noise) (*DiscreteGaussian, error) {
	if sigma2 == nil || sigma2.Sign() <= 0 {
		return nil, fmt.Errorf("dp: discrete gaussian σ² must be positive")
	}
	if src == nil {
		src = NewNoise()
	}
	num, den := new(big.Int).Set(sigma2.Num()), new(big.Int).Set(sigma2.Denom())
	// t = floor(sqrt(σ²)) + 1 = isqrt(floor(σ²)) + 1.
	fl := new(big.Int).Quo(num, den)
	t := new(big.Int).Sqrt(fl)
	t.Add(t, big.NewInt(1))
	if !t.IsUint64() || t.Uint64() > 1<<41 {
		return nil, fmt.Errorf("dp: discrete gaussian σ² is too large")
	}
	f, _ := sigma2.Float64()
	return &DiscreteGaussian{
		src: src, num: num, den: den, t: t, tU64: t.Uint64(), sigma: math.Sqrt(f),
		a: new(big.Int), b: new(big.Int), c: new(big.Int), d: new(big.Int),
	}, nil
}

// Sigma2 returns the exact variance parameter σ² the sampler uses.
func (g *DiscreteGaussian) Sigma2() *big.Rat { return new(big.Rat).SetFrac(g.num, g.den) }

func (g *DiscreteGaussian) String() string {
	return fmt.Sprintf("DiscreteGaussian(σ²=%s)", g.Sigma2().RatString())
}

// Sample returns one draw from N_Z(0, σ²).
func (g *DiscreteGaussian) Sample() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sample()
}

// AddTo adds an independent draw to each element of v, in place.
func (g *DiscreteGaussian) AddTo(v []int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range v {
		v[i] += g.sample()
	}
}

// sample is CKS Algorithm 3: Y ← Lap_Z(t); accept with probability
// exp(−(|Y| − σ²/t)² / (2σ²)).
func (g *DiscreteGaussian) sample() int64 {
	for {
		y := g.discreteLaplace()
		ay := y
		if ay < 0 {
			ay = -ay
		}
		// γ = (|Y| − σ²/t)² / (2σ²) = (|Y|·t·den − num)² / (2·num·den·t²).
		g.a.SetInt64(ay)
		g.a.Mul(g.a, g.t)
		g.a.Mul(g.a, g.den)
		g.a.Sub(g.a, g.num)
		g.a.Mul(g.a, g.a) // numerator of γ
		g.b.Mul(g.num, g.den)
		g.b.Lsh(g.b, 1)
		g.c.Mul(g.t, g.t)
		g.b.Mul(g.b, g.c) // denominator of γ
		if g.bernoulliExp(g.a, g.b) {
			return y
		}
	}
}

// discreteLaplace is CKS Algorithm 2 with s = 1: P[Y = y] ∝ exp(−|y|/t).
func (g *DiscreteGaussian) discreteLaplace() int64 {
	t := g.tU64
	for {
		u := g.src.uint64n(t)
		// D ← Bernoulli(exp(−u/t)).
		g.c.SetUint64(u)
		g.d.SetUint64(t)
		if !g.bernoulliExp(g.c, g.d) {
			continue
		}
		// V ← number of successes of Bernoulli(exp(−1)) before a failure.
		var v uint64
		one := big.NewInt(1)
		for {
			g.c.SetInt64(1)
			if !g.bernoulliExp(g.c, one) {
				break
			}
			v++
		}
		x := u + t*v
		neg := g.src.uint64n(2) == 1
		if neg && x == 0 {
			continue
		}
		if neg {
			return -int64(x)
		}
		return int64(x)
	}
}

// bernoulliExp returns true with probability exp(−n/d), n ≥ 0, d > 0 (CKS
// Algorithm 1). n and d are not modified.
func (g *DiscreteGaussian) bernoulliExp(n, d *big.Int) bool {
	// Work on copies: n and d may alias scratch values.
	nn := new(big.Int).Set(n)
	dd := new(big.Int).Set(d)
	// For γ > 1: exp(−γ) = exp(−1)^floor(γ) · exp(−(γ − floor γ)).
	if nn.Cmp(dd) > 0 {
		whole, rem := new(big.Int).QuoRem(nn, dd, new(big.Int))
		one := big.NewInt(1)
		for k := new(big.Int); k.Cmp(whole) < 0; k.Add(k, one) {
			if !g.bernoulliExp01(one, one) {
				return false
			}
		}
		nn = rem
	}
	return g.bernoulliExp01(nn, dd)
}

// bernoulliExp01 returns true with probability exp(−n/d) for 0 ≤ n/d ≤ 1:
// K ← 1; while Bernoulli(γ/K) K++; return K odd.
func (g *DiscreteGaussian) bernoulliExp01(n, d *big.Int) bool {
	k := int64(1)
	kd := new(big.Int)
	for {
		kd.Mul(d, big.NewInt(k))
		if !g.bernoulliRat(n, kd) {
			break
		}
		k++
	}
	return k%2 == 1
}

// bernoulliRat returns true with probability n/d (0 ≤ n ≤ d).
func (g *DiscreteGaussian) bernoulliRat(n, d *big.Int) bool {
	if n.Sign() == 0 {
		return false
	}
	if d.IsUint64() {
		return g.src.uint64n(d.Uint64()) < n.Uint64()
	}
	return g.uniformBig(d).Cmp(n) < 0
}

// uniformBig returns a uniform integer in [0, d) by rejection.
func (g *DiscreteGaussian) uniformBig(d *big.Int) *big.Int {
	bits := d.BitLen()
	nbytes := (bits + 7) / 8
	if cap(g.buf) < nbytes {
		g.buf = make([]byte, nbytes)
	}
	buf := g.buf[:nbytes]
	r := new(big.Int)
	for {
		g.src.read(buf)
		if extra := nbytes*8 - bits; extra > 0 {
			buf[0] &= byte(0xff >> extra)
		}
		r.SetBytes(buf)
		if r.Cmp(d) < 0 {
			return r
		}
	}
}
