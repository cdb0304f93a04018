package dp

import (
	"math/big"
	"math/bits"
	"math/rand/v2"
)

// intGaussian samples exactly from N_Z(0, T²) for an integer T ≥ 1 with
// 64-bit integer arithmetic only. It is Canonne–Kamath–Steinke 2020,
// Algorithm 3, with the Laplace scale t = T instead of ⌊σ⌋+1: the
// algorithm's output is N_Z(0, σ²) for any positive t (the acceptance
// probability exp(−(|Y| − σ²/t)²/(2σ²)) times the Laplace's exp(−|Y|/t)
// is proportional to exp(−Y²/(2σ²)) whatever t is), and with σ² = T² the
// mean σ²/t = T is an integer, so the acceptance exponent is the ratio
// (|Y| − T)²/(2T²) of two integers below 2^63 (T ≤ 2^26, |Y| < 2^31). A
// Y beyond that takes the big-integer path (DiscreteGaussian), so the
// distribution stays exact. Every Bernoulli trial compares uniform
// integers (rand.Rand.Uint64N, unbiased) from a ChaCha8 stream keyed from
// the caller's Noise; no floating-point number takes part.
//
// An intGaussian is not safe for concurrent use; it holds its own stream
// so the hot loop takes no lock.
type intGaussian struct {
	t   uint64
	rng *rand.Rand
	big *DiscreteGaussian // for the rare |Y| ≥ 2^31 acceptance test
	// A reservoir of random bits, for the Laplace's sign.
	bits  uint64
	nbits uint
}

// bit returns one uniform random bit.
func (g *intGaussian) bit() uint64 {
	if g.nbits == 0 {
		g.bits, g.nbits = g.rng.Uint64(), 64
	}
	b := g.bits & 1
	g.bits >>= 1
	g.nbits--
	return b
}

// bernoulliRat returns true with probability n/d exactly, 0 ≤ n ≤ d,
// d > 0, by comparing a uniform integer below d (Lemire's unbiased
// method) with n.
func (g *intGaussian) bernoulliRat(n, d uint64) bool {
	if n == 0 {
		return false
	}
	if n >= d {
		return true
	}
	return g.rng.Uint64N(d) < n
}

// newIntGaussian returns a sampler of N_Z(0, t²), 1 ≤ t ≤ maxGridT,
// drawing from rng (a stream keyed from a Noise: Noise.fork).
func newIntGaussian(t uint64, rng *rand.Rand) *intGaussian {
	if t < 1 || t > maxGridT {
		panic("dp: integer discrete gaussian scale out of range")
	}
	return &intGaussian{t: t, rng: rng}
}

// fork returns a generator on a fresh ChaCha8 stream keyed with 32 bytes
// of this Noise's secure stream (for one goroutine's hot loop).
func (n *Noise) fork() *rand.Rand {
	var seed [32]byte
	n.read(seed[:])
	return rand.New(rand.NewChaCha8(seed))
}

func (g *intGaussian) addTo(v []int64) {
	for i := range v {
		v[i] += g.sample()
	}
}

// sample is CKS Algorithm 3 with t = T: Y ← Lap_Z(T); accept with
// probability exp(−(|Y| − T)²/(2T²)).
func (g *intGaussian) sample() int64 {
	t := g.t
	for {
		y := g.laplace()
		ay := uint64(y)
		if y < 0 {
			ay = uint64(-y)
		}
		var a uint64
		if ay >= t {
			a = ay - t
		} else {
			a = t - ay
		}
		if a >= 1<<31 {
			if g.acceptBig(a) {
				return y
			}
			continue
		}
		if g.bernoulliExp(a*a, 2*t*t) {
			return y
		}
	}
}

// laplace is CKS Algorithm 2 with s = 1: P[Y = y] ∝ exp(−|y|/T).
func (g *intGaussian) laplace() int64 {
	t := g.t
	for {
		u := g.rng.Uint64N(t)
		if !g.bernoulliExp01(u, t) {
			continue
		}
		var v uint64
		for g.bernoulliExp01(1, 1) {
			v++
		}
		x := u + t*v
		neg := g.bit() == 1
		if neg && x == 0 {
			continue
		}
		if neg {
			return -int64(x)
		}
		return int64(x)
	}
}

// bernoulliExp returns true with probability exp(−n/d), d > 0 (CKS
// Algorithm 1): exp(−1) ⌊n/d⌋ times, then exp(−(n mod d)/d).
func (g *intGaussian) bernoulliExp(n, d uint64) bool {
	for k := n / d; k > 0; k-- {
		if !g.bernoulliExp01(1, 1) {
			return false
		}
	}
	return g.bernoulliExp01(n%d, d)
}

// bernoulliExp01 returns true with probability exp(−n/d) for 0 ≤ n ≤ d:
// K ← 1; while Bernoulli(n/(K·d)) K++; return K odd. K·d overflowing 64
// bits ends the loop: Bernoulli(n/(K·d)) is then below 2^−63·n/d… and is
// decided exactly on 128 bits.
func (g *intGaussian) bernoulliExp01(n, d uint64) bool {
	if n == 0 {
		return true
	}
	k := uint64(1)
	for {
		hi, kd := bits.Mul64(k, d)
		if hi != 0 {
			if !g.bernoulli128(n, hi, kd) {
				break
			}
		} else if !g.bernoulliRat(n, kd) {
			break
		}
		k++
	}
	return k%2 == 1
}

// bernoulli128 returns true with probability n/(hi·2^64 + lo) exactly.
func (g *intGaussian) bernoulli128(n, hi, lo uint64) bool {
	d := new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64)
	d.Or(d, new(big.Int).SetUint64(lo))
	var buf [24]byte
	bitsLen := d.BitLen()
	r := new(big.Int)
	for {
		for i := 0; i < len(buf); i += 8 {
			w := g.rng.Uint64()
			for j := range 8 {
				buf[i+j] = byte(w >> (8 * j))
			}
		}
		r.SetBytes(buf[:])
		r.Rsh(r, uint(len(buf)*8-bitsLen))
		if r.Cmp(d) < 0 {
			return r.Cmp(new(big.Int).SetUint64(n)) < 0
		}
	}
}

// acceptBig decides the acceptance exp(−a²/(2T²)) for a ≥ 2^31 with big
// integers (probability below exp(−2^61/2^53) in practice, but exact).
func (g *intGaussian) acceptBig(a uint64) bool {
	if g.big == nil {
		var seed [32]byte
		for i := 0; i < 32; i += 8 {
			w := g.rng.Uint64()
			for j := range 8 {
				seed[i+j] = byte(w >> (8 * j))
			}
		}
		s2 := new(big.Rat).SetInt(new(big.Int).Mul(new(big.Int).SetUint64(g.t), new(big.Int).SetUint64(g.t)))
		g.big, _ = NewDiscreteGaussianRat(s2, newNoiseFromSeed(seed))
	}
	n := new(big.Int).SetUint64(a)
	n.Mul(n, n)
	d := new(big.Int).SetUint64(g.t)
	d.Mul(d, d)
	d.Lsh(d, 1)
	return g.big.bernoulliExp(n, d)
}
