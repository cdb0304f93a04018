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

// Stochastic rounding takes roundBytes bytes of keystream per value: a
// 16-bit draw d is compared with the top 16 bits h of the value's
// fraction (frac·2^16 = h + r, r in [0, 1)). d < h rounds up, d > h rounds
// down, and on a tie (probability 2^-16) 64 more random bits u from
// crypto/rand decide: up iff u < ⌊r·2^64⌋. So a value rounds up with
// probability (h + ⌊r·2^64⌋·2^-64)·2^-16 = ⌊frac·2^80⌋·2^-80: the encoding
// is unbiased to within 2^-80 of one grid step (2^-(f+80)), against 2^-64
// when every value took a whole 64-bit draw, for a quarter of the
// keystream. TestRoundingDecisionIsExact checks the decision over all
// 2^16 draws; TestStochasticRoundingTinyFraction that fractions below
// 2^-16 still round up at their rate.
const roundBytes = 2

// tieDraw returns 64 uniform bits for a tie between a draw and a
// fraction. A variable so a test can make ties deterministic.
var tieDraw = func() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("secagg: crypto/rand: " + err.Error()) // Go's crypto/rand does not fail
	}
	return binary.LittleEndian.Uint64(b[:])
}

// rounder draws the uniform 16-bit words that decide stochastic rounding,
// from a keystream keyed with 32 bytes of crypto/rand: bytes
// [roundBytes·i, roundBytes·(i+1)) decide coordinate i, so the cores
// encoding different segments each seek their own rounder (at) and the
// draws never overlap.
type rounder struct {
	g   PRG
	key []byte
	s   cipher.Stream
	buf [256]byte
	off int
}

func newRounder(g PRG) (*rounder, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return (&rounder{g: g, key: key}).at(0), nil
}

// at returns a rounder under the same key positioned at coordinate i.
func (r *rounder) at(i int) *rounder {
	return &rounder{g: r.g, key: r.key, s: r.g.streamAt(r.key, roundBytes*i), off: len(r.buf)}
}

// wipe forgets the key (every rounder made by at shares it).
func (r *rounder) wipe() { clear(r.key) }

// next returns the draw of the coordinate the rounder is positioned at
// and moves to the next one.
func (r *rounder) next() uint64 {
	if r.off == len(r.buf) {
		r.s.XORKeyStream(r.buf[:], zeroChunk[:len(r.buf)])
		r.off = 0
	}
	d := binary.LittleEndian.Uint16(r.buf[r.off:])
	r.off += roundBytes
	return uint64(d)
}

// draws fills dst with the draws of the next len(dst)/roundBytes
// coordinates, straight from the keystream (a rounder serves either
// next or draws, not both).
func (r *rounder) draws(dst []byte) { r.s.XORKeyStream(dst, zeroChunk[:len(dst)]) }

// encodeValue maps x (finite, |x| ≤ the bound the caller checked) to the
// ring with scale = 2^f, rounding up with probability frac(x·2^f) (to
// within 2^-80, see roundBytes), with the next draw of r.
func encodeValue(x, scale float64, r *rounder) uint64 {
	var w [8]byte
	var d [roundBytes]byte
	le.PutUint16(d[:], uint16(r.next()))
	encodeTile(w[:], 8, []float64{x}, scale, d[:])
	return le.Uint64(w[:])
}

// tieUp settles a tie: 1 with probability ⌊r·2^64⌋·2^-64. Not inlined,
// so the encoding loops around its rare call stay small.
//
//go:noinline
func tieUp(r float64) int64 {
	if tieDraw() < uint64(r*0x1p64) {
		return 1
	}
	return 0
}

// encodeTile encodes x into dst (len(x) coordinates of width bytes, the
// first at an even index: see putCoords) with one draw per value from
// draws: the client's encoding, one tile at a time.
//
// Scaling by a power of two is exact here (no overflow below 2^62, no
// underflow since f ≥ 0), and so are the floor, the fraction, frac·2^16
// and its split into h and r (see roundBytes). The comparison d < h is
// arithmetic, not a branch: it is a coin flip for the branch predictor.
func encodeTile(dst []byte, width int, x []float64, scale float64, draws []byte) {
	draws = draws[:roundBytes*len(x)]
	dst = dst[:width*len(x)]
	// AVX2 where the CPU has it (encode_amd64.s), four values at a time
	// with ties settled after; the loops below do the rest.
	if n, tie := roundBulk(dst, width, x, scale, draws); n > 0 {
		if tie {
			settleTies(dst[:width*n], width, x[:n], scale, draws[:roundBytes*n])
		}
		x, draws, dst = x[n:], draws[roundBytes*n:], dst[width*n:]
	}
	// Eight values at a time through array pointers, written out: a third
	// of the time of a plain loop (no bounds checks, no loop counter).
	for len(x) >= 8 {
		xs, r := (*[8]float64)(x), (*[8 * roundBytes]byte)(draws)
		enc := func(j int) uint64 {
			v := xs[j] * scale
			fl := math.Floor(v)
			t := (v - fl) * 0x1p16
			h := int64(t)
			d := int64(r[2*j]) | int64(r[2*j+1])<<8
			n := int64(fl) + int64(uint64(d-h)>>63) // +1 iff d < h
			if d == h {
				n += tieUp(t - float64(h))
			}
			return uint64(n)
		}
		if width == 8 {
			d := (*[64]byte)(dst)
			le.PutUint64(d[0:], enc(0))
			le.PutUint64(d[8:], enc(1))
			le.PutUint64(d[16:], enc(2))
			le.PutUint64(d[24:], enc(3))
			le.PutUint64(d[32:], enc(4))
			le.PutUint64(d[40:], enc(5))
			le.PutUint64(d[48:], enc(6))
			le.PutUint64(d[56:], enc(7))
		} else {
			d := (*[32]byte)(dst)
			le.PutUint64(d[0:], enc(0)+enc(1)<<32)
			le.PutUint64(d[8:], enc(2)+enc(3)<<32)
			le.PutUint64(d[16:], enc(4)+enc(5)<<32)
			le.PutUint64(d[24:], enc(6)+enc(7)<<32)
		}
		x, draws, dst = x[8:], draws[8*roundBytes:], dst[8*width:]
	}
	// The rest, one value at a time (same arithmetic).
	enc := func(j int) uint64 {
		v := x[j] * scale
		fl := math.Floor(v)
		t := (v - fl) * 0x1p16
		h := int64(t)
		d := int64(le.Uint16(draws[2*j:]))
		n := int64(fl) + int64(uint64(d-h)>>63)
		if d == h {
			n += tieUp(t - float64(h))
		}
		return uint64(n)
	}
	j := 0
	if width == 4 {
		for ; j+1 < len(x); j += 2 {
			le.PutUint64(dst[4*j:], enc(j)+enc(j+1)<<32)
		}
		if j < len(x) {
			le.PutUint32(dst[4*j:], uint32(enc(j)))
		}
		return
	}
	for ; j < len(x); j++ {
		le.PutUint64(dst[8*j:], enc(j))
	}
}

// encodeAddTile is encodeTile followed by sumWords(dst, c, src, k) in
// one pass: each word of the tile is stored once, the encoded value plus
// the first batch of masks (see fillFunc). On amd64 with AVX2 the bulk
// does both in registers (encodeAddAVX2); elsewhere, and for the last
// values, the tile is encoded, then the masks added while it is in L1.
// Ties are settled afterwards: one more on a coordinate commutes with
// the masks.
func encodeAddTile(dst []byte, width int, x []float64, scale float64, draws []byte, c uint64, src *[maskBatch][]byte, k int) {
	draws = draws[:roundBytes*len(x)]
	dst = dst[:width*len(x)]
	n, tie := roundAddBulk(dst, width, x, scale, draws, c, src, k)
	if tie {
		settleTies(dst[:width*n], width, x[:n], scale, draws[:roundBytes*n])
	}
	if n == len(x) {
		return
	}
	o := width * n
	encodeTile(dst[o:], width, x[n:], scale, draws[roundBytes*n:])
	var rest [maskBatch][]byte
	for j := range k {
		rest[j] = src[j][o:len(dst)]
	}
	sumWords(dst[o:], c, &rest, k)
}

// settleTies adds tieUp's verdict to every value of a tile encoded with
// ties rounded down (roundBulk) whose draw tied with its fraction, with
// encodeTile's arithmetic.
func settleTies(dst []byte, width int, x []float64, scale float64, draws []byte) {
	for j, xv := range x {
		v := xv * scale
		t := (v - math.Floor(v)) * 0x1p16
		h := int64(t)
		if int64(le.Uint16(draws[2*j:])) != h || tieUp(t-float64(h)) == 0 {
			continue
		}
		switch {
		case width == 8:
			le.PutUint64(dst[8*j:], le.Uint64(dst[8*j:])+1)
		case j%2 == 0 && j+1 == len(x):
			le.PutUint32(dst[4*j:], le.Uint32(dst[4*j:])+1) // a last odd coordinate
		default:
			// The pair's word is a + 2^32·b (putCoords): one more on
			// either value is one more on its half of the word.
			le.PutUint64(dst[4*(j&^1):], le.Uint64(dst[4*(j&^1):])+uint64(1)<<(32*(j%2)))
		}
	}
}

// decodeValue reads a ring element as a signed fixed-point value.
func decodeValue(w uint64, f int) float64 {
	return math.Ldexp(float64(int64(w)), -f)
}

// inRange reports whether x is finite and |x| ≤ bound.
func inRange(x, bound float64) bool {
	return !math.IsNaN(x) && math.Abs(x) <= bound
}
