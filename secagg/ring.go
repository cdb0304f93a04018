package secagg

import (
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"math"
)

// The ring is Z_2^64: uint64 arithmetic with wrap-around. A real value x with
// |x| ≤ bound is encoded in fixed point as the two's-complement image of an
// integer near x·2^f, where f (the fraction bits) is the largest value such
// that n·(bound·2^f + 1) ≤ 2^62 for the n sites of the round. The sum of n
// encoded values then lies in (−2^62, 2^62): it never wraps, and reading it
// back as a signed int64 recovers it exactly. Values are rounded
// stochastically (up with probability equal to the fractional part) so the
// encoding is unbiased; the randomness comes from a keystream seeded from
// crypto/rand.

// ringHeadroom is the bound on |sum| in integer units: a bit of slack below
// 2^63 so that float rounding in the parameter derivation cannot matter.
const ringHeadroom = 1 << 62

// maxFracBits bounds the fraction bits so 2^f stays a finite float64.
const maxFracBits = 1000

// fracBitsFor returns the largest f ≤ maxFracBits with
// n·(bound·2^f + 1) ≤ 2^62, and false if even f = 0 does not fit.
// The explicit float64 conversions forbid fused multiply-adds, so every
// platform derives the same f.
func fracBitsFor(bound float64, n int) (int, bool) {
	fits := func(f int) bool {
		return float64(n)*float64(math.Ldexp(bound, f)+1) <= ringHeadroom
	}
	if !(bound > 0) || math.IsInf(bound, 0) || n < 1 || !fits(0) {
		return 0, false
	}
	f := 0
	for f < maxFracBits && fits(f+1) {
		f++
	}
	return f, true
}

// rounder draws the uniform 64-bit words that decide stochastic rounding,
// from a keystream keyed with 32 bytes of crypto/rand: word i decides
// coordinate i, so the cores encoding different segments each seek their
// own rounder (at) and the draws never overlap.
type rounder struct {
	g   PRG
	key []byte
	s   cipher.Stream
	buf [tileBytes]byte
	off int
}

func newRounder(g PRG) (*rounder, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return (&rounder{g: g, key: key}).at(0), nil
}

// at returns a rounder under the same key positioned at word i.
func (r *rounder) at(i int) *rounder {
	return &rounder{g: r.g, key: r.key, s: r.g.streamAt(r.key, 8*i), off: tileBytes}
}

// wipe forgets the key (every rounder made by at shares it).
func (r *rounder) wipe() { clear(r.key) }

func (r *rounder) next() uint64 {
	if r.off == len(r.buf) {
		r.s.XORKeyStream(r.buf[:], zeroChunk[:])
		r.off = 0
	}
	w := binary.LittleEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return w
}

// encodeValue maps x (finite, |x| ≤ the bound the caller checked) to the
// ring with scale = 2^f, rounding up with probability frac(x·2^f). Scaling
// by a power of two is exact here (no overflow below 2^62, no underflow
// since f ≥ 0), and so are the floor, the fraction and frac·2^64.
func encodeValue(x, scale float64, r *rounder) uint64 {
	v := x * scale
	fl := math.Floor(v)
	frac := v - fl // in [0, 1)
	n := int64(fl)
	if r.next() < uint64(frac*0x1p64) {
		n++
	}
	return uint64(n)
}

// decodeValue reads a ring element as a signed fixed-point value.
func decodeValue(w uint64, f int) float64 {
	return math.Ldexp(float64(int64(w)), -f)
}

// inRange reports whether x is finite and |x| ≤ bound.
func inRange(x, bound float64) bool {
	return !math.IsNaN(x) && math.Abs(x) <= bound
}
