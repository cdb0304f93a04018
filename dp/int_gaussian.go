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
// distribution stays exact. No floating-point number takes part.
//
// Randomness: the sampler reads 64-bit words from a ChaCha8 stream keyed
// from the caller's Noise (a cryptographic generator, held as the concrete
// type so the hot loop makes no interface call) and spends them a few bits
// at a time from a reservoir. A Bernoulli(n/d) trial compares the binary
// expansion of a uniform U ∈ [0, 1) with n/d lazily: one chunk of k bits
// x (k = 16, 32 or 64, chosen so that d ≤ 2^(k−8)) decides it unless
// x·d < n·2^k < (x+1)·d, which happens with probability below d/2^k ≤
// 2^−8; then the trial continues, exactly, as Bernoulli((n·2^k − x·d)/d)
// on the next chunk (U's remaining bits are uniform given x). Most trials
// in CKS's loops have tiny d (1/K for the Laplace's geometric part), so
// one ChaCha8 word decides about four of them instead of one; the exact
// distribution is untouched (bits discarded when the reservoir is short
// are discarded whatever their values).
//
// An intGaussian is not safe for concurrent use; it holds its own stream
// so the hot loop takes no lock.
type intGaussian struct {
	t   uint64
	src *rand.ChaCha8
	big *DiscreteGaussian // for the rare |Y| ≥ 2^31 acceptance test
	// The reservoir: nbits uniform random bits in the low end of bits.
	bits  uint64
	nbits uint
}

// take returns k uniform random bits, 1 ≤ k ≤ 32, from the reservoir,
// refilling it with a fresh word when fewer than k are left.
func (g *intGaussian) take(k uint) uint64 {
	if g.nbits < k {
		g.bits, g.nbits = g.src.Uint64(), 64
	}
	v := g.bits & (1<<k - 1)
	g.bits >>= k
	g.nbits -= k
	return v
}

// bernoulliRat returns true with probability n/d exactly, 0 ≤ n ≤ d,
// 0 < d ≤ 2^63, by the lazy comparison of a uniform U with n/d described
// on intGaussian.
func (g *intGaussian) bernoulliRat(n, d uint64) bool {
	if n == 0 {
		return false
	}
	if n >= d {
		return true
	}
	for {
		// 0 < n < d from here on.
		var k uint
		switch {
		case d <= 1<<8:
			k = 16
		case d <= 1<<24:
			k = 32
		default:
			// x·d on 128 bits against n·2^64: U·d < n for sure when
			// (x+1)·d ≤ n·2^64, never when x·d ≥ n·2^64.
			hi, lo := bits.Mul64(g.src.Uint64(), d)
			if hi >= n {
				return false
			}
			if hi < n-1 || lo <= -d {
				return true
			}
			n = -lo // n·2^64 − x·d = 2^64 − lo ∈ (0, d)
			continue
		}
		// x·d < 2^(k+24) and n·2^k < 2^(2k−8): no overflow for k ≤ 32.
		xd, nk := g.take(k)*d, n<<k
		if xd >= nk {
			return false
		}
		if xd+d <= nk {
			return true
		}
		n = nk - xd // ∈ (0, d)
	}
}

// uniform returns a uniform integer in [0, t), 0 < t < 2^32, exactly:
// Lemire's multiply-and-reject on 32 random bits (Lemire 2019, Alg. 5).
func (g *intGaussian) uniform(t uint64) uint64 {
	m := g.take(32) * t
	if l := uint32(m); uint64(l) < t {
		thresh := uint32(-uint32(t)) % uint32(t) // 2^32 mod t
		for l < thresh {
			m = g.take(32) * t
			l = uint32(m)
		}
	}
	return m >> 32
}

// newIntGaussian returns a sampler of N_Z(0, t²), 1 ≤ t ≤ maxGridT,
// drawing from src (a stream keyed from a Noise: Noise.forkChaCha8).
func newIntGaussian(t uint64, src *rand.ChaCha8) *intGaussian {
	if t < 1 || t > maxGridT {
		panic("dp: integer discrete gaussian scale out of range")
	}
	return &intGaussian{t: t, src: src}
}

// forkChaCha8 returns a fresh ChaCha8 stream keyed with 32 bytes of this
// Noise's secure stream (for one goroutine's hot loop).
func (n *Noise) forkChaCha8() *rand.ChaCha8 {
	var seed [32]byte
	n.read(seed[:])
	return rand.NewChaCha8(seed)
}

// fork returns a generator on a fresh ChaCha8 stream keyed from this Noise.
func (n *Noise) fork() *rand.Rand { return rand.New(n.forkChaCha8()) }

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
		u := g.uniform(t)
		if !g.bernoulliExp01(u, t) {
			continue
		}
		var v uint64
		for g.bernoulliExpOne() {
			v++
		}
		x := u + t*v
		neg := g.take(1) == 1
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
		if !g.bernoulliExpOne() {
			return false
		}
	}
	return g.bernoulliExp01(n%d, d)
}

// bernoulliExpOne returns true with probability exp(−1). It is CKS's
// loop for exp(−1) — K ← 1; while Bernoulli(1/K) K++; return K odd —
// with K drawn at once by inversion: P(K ≥ k) = 1/(k−1)!, so K is the
// least k with U ≥ 1/k! for one uniform U ∈ [0, 1) (the events are
// nested, so one U gives the loop's distribution of K exactly). U's first
// 64 bits x decide each comparison unless x·k! < 2^64 < (x+1)·k!
// (probability k!/2^64 at step k, which is reached with probability
// 1/(k−1)!); then, or beyond 20! (which overflows 64 bits), the
// comparison goes on exactly with more bits of U (expOneSlow).
func (g *intGaussian) bernoulliExpOne() bool { return g.expOneFrom(g.src.Uint64()) }

// expOneFrom is bernoulliExpOne with U's first 64 bits x.
func (g *intGaussian) expOneFrom(x uint64) bool {
	for k := 1; k < len(factorials); k++ {
		hi, lo := bits.Mul64(x, factorials[k])
		if hi != 0 { // x·k! ≥ 2^64: U ≥ 1/k!
			return k%2 == 1
		}
		if lo > -factorials[k] { // x·k! < 2^64 < (x+1)·k!: undecided
			return g.expOneSlow(x, k)
		}
	}
	return g.expOneSlow(x, len(factorials))
}

// factorials[k] = k! for k ≤ 20 (21! overflows 64 bits).
var factorials = func() (f [21]uint64) {
	f[0] = 1
	for k := 1; k < len(f); k++ {
		f[k] = f[k-1] * uint64(k)
	}
	return f
}()

// expOneSlow finishes bernoulliExpOne from step k with U's known prefix x
// (64 bits), drawing more bits of U as comparisons need them: with the
// prefix p of L bits, U ≥ 1/k! when p·k! ≥ 2^L, U < 1/k! when
// (p+1)·k! ≤ 2^L, and otherwise 64 more bits are appended.
func (g *intGaussian) expOneSlow(x uint64, k int) bool {
	p := new(big.Int).SetUint64(x)
	L := uint(64)
	fact := new(big.Int)
	fact.MulRange(1, int64(k))
	pow, lhs := new(big.Int), new(big.Int)
	for {
		pow.Lsh(big.NewInt(1), L)
		lhs.Mul(p, fact)
		if lhs.Cmp(pow) >= 0 {
			return k%2 == 1
		}
		lhs.Add(lhs, fact)
		if lhs.Cmp(pow) <= 0 {
			k++
			fact.Mul(fact, big.NewInt(int64(k)))
			continue
		}
		p.Lsh(p, 64)
		p.Or(p, new(big.Int).SetUint64(g.src.Uint64()))
		L += 64
	}
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
		if hi != 0 || kd > 1<<63 {
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
			w := g.src.Uint64()
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
			w := g.src.Uint64()
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
