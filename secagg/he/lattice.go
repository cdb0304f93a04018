package he

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"

	"github.com/tuneinsight/lattigo/v5/core/rlwe"
	"github.com/tuneinsight/lattigo/v5/he/heint"
	"github.com/tuneinsight/lattigo/v5/ring"
	"golang.org/x/crypto/chacha20poly1305"
)

// unmarshalPoly decodes an untrusted ring polynomial of the round's top
// level. The length is checked first; lattigo's decoder trusts the header
// it reads, so a crafted header that still has the right length is caught
// by recover and by the shape check after it (a decoder panic on bytes
// from the network must refuse the message, not kill the aggregator).
func (r *round) unmarshalPoly(kind string, b []byte) (p ring.Poly, err error) {
	if len(b) != r.s.c1Size {
		return p, malformed(kind, "%d bytes, want %d", len(b), r.s.c1Size)
	}
	defer func() {
		if e := recover(); e != nil {
			err = malformed(kind, "cannot decode: %v", e)
		}
	}()
	if err := p.UnmarshalBinary(b); err != nil {
		return p, malformed(kind, "cannot decode: %v", err)
	}
	rq := r.s.params.RingQ()
	if p.N() != rq.N() || p.Level() != rq.Level() {
		return p, malformed(kind, "a polynomial of degree %d and level %d, want %d and %d", p.N(), p.Level(), rq.N(), rq.Level())
	}
	for i, c := range p.Coeffs {
		q := rq.SubRings[i].Modulus
		for _, v := range c {
			if v >= q {
				return p, malformed(kind, "a coefficient outside [0, q)")
			}
		}
	}
	return p, nil
}

// ciphertext rebuilds a ciphertext from its two polynomials with the
// round's own metadata.
func (r *round) ciphertext(c0, c1 ring.Poly) *rlwe.Ciphertext {
	ct := r.newCiphertext()
	ct.Value[0], ct.Value[1] = c0, c1
	return ct
}

func (r *round) newCiphertext() *rlwe.Ciphertext {
	ct := heint.NewCiphertext(r.s.params, 1, r.s.params.MaxLevel())
	ct.IsBatched = false
	return ct
}

func (r *round) newPlaintext() *rlwe.Plaintext {
	pt := heint.NewPlaintext(r.s.params, r.s.params.MaxLevel())
	pt.IsBatched = false // coefficient encoding: only additions are evaluated
	return pt
}

// Boxes: X25519 between the sites' advertised keys, HKDF-SHA-256 bound to
// the session and both parties, XChaCha20-Poly1305 with a random nonce.

func boxKey(priv *ecdh.PrivateKey, peer []byte, session []byte, from, to string) ([]byte, error) {
	pub, err := ecdh.X25519().NewPublicKey(peer)
	if err != nil {
		return nil, err
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		return nil, err
	}
	return hkdf.Key(sha256.New, shared, session, "scellis/he/v1/share-box\x00"+from+"\x00"+to, chacha20poly1305.KeySize)
}

func boxAD(session []byte, round, from, to string) []byte {
	return mustEncode([]any{"scellis/he/v1/share-ad", session, round, from, to})
}

// sealedSize is the size of a box holding one Shamir share.
func (r *round) sealedSize() int {
	return chacha20poly1305.NonceSizeX + r.s.skSize + chacha20poly1305.Overhead
}

// pack writes into dst (one value per plaintext coefficient) the values
// of y that ciphertext k carries: coefficient j holds the lanes values
// y[(k·N+j)·lanes + l] as Σ_l y·2^(w·l), zero past the end of y.
func (r *round) pack(dst, y []int64, k int) {
	base := k * len(dst) * r.lanes
	for j := range dst {
		var v int64
		for l := r.lanes - 1; l >= 0; l-- {
			v <<= r.laneW
			if i := base + j*r.lanes + l; i < len(y) {
				v += y[i]
			}
		}
		dst[j] = v
	}
}

// unpack reads ciphertext k's decoded coefficients back into sum: the
// lowest lane of a coefficient is its centred residue modulo 2^w (each
// lane's sum is within ±2^(w−1), lanesFor), the rest the quotient. A lane
// outside its range means the sum is not the sum of inputs within the
// bound (a site sent an input it did not check, or a bad share).
func (r *round) unpack(sum, vals []int64, k int) error {
	base := k * len(vals) * r.lanes
	half := int64(1) << max(r.laneW-1, 0)
	for j, v := range vals {
		for l := range r.lanes {
			i := base + j*r.lanes + l
			lane := v
			if l < r.lanes-1 {
				lane = v & (2*half - 1)
				if lane >= half {
					lane -= 2 * half
				}
				v = (v - lane) >> r.laneW
			}
			if i < len(sum) {
				sum[i] = lane
			} else if lane != 0 {
				return malformed("decrypted sum", "a padding value of ciphertext %d is %d, not 0", k, lane)
			}
		}
	}
	return nil
}

// A partial decryption travels rounded: the decrypted sum needs only
// |noise| < Q/(2T) ≈ 2^59.9, and each share's noise is already up to
// 6σ = 2^42.6 of smudging, so a share rounded to a multiple of
// 2^shareDrop adds at most 2^(shareDrop−1) more per decryptor: with
// t ≤ 255 decryptors the total stays below 255·(6σ + 2^47) ≈ 2^55.1, a margin
// of 2^4.8. The rounded centred coefficient, within ±Q/2^(shareDrop+1)
// < 2^71, takes shareWordBytes bytes instead of a 16-byte residue pair.
// Rounding is done after the smudging noise is added, on the integer
// coefficient (Garner's CRT of the two residues, checked against
// lattigo's ring.PolyToBigintCentered by TestShareRounding): it only
// removes information from what the aggregator sees.
const (
	shareDrop      = 48
	shareWordBytes = 9
)

// shareBytes is the size of one rounded partial decryption.
func (r *round) shareBytes() int { return ShareBytes() }

// ShareBytes is the size of one rounded partial decryption (one per
// ciphertext in a DecryptShare). Transports bound their bodies with it.
func ShareBytes() int { return shareWordBytes * Slots() }

// marshalShare rounds a partial decryption (NTT domain) and encodes it:
// each coefficient's residues (r0, r1) modulo Q = q0·q1 are joined by
// Garner's CRT, x = r0 + q0·((r1 − r0)·q0⁻¹ mod q1) in [0, Q), centred,
// rounded to the nearest multiple of 2^shareDrop and written as the
// 72-bit two's complement quotient, little-endian (TestShareRounding
// checks it against lattigo's own CRT, ring.PolyToBigintCentered).
func (r *round) marshalShare(p ring.Poly) []byte {
	rq := r.s.params.RingQ()
	c := rq.NewPoly()
	rq.INTT(p, c)
	rq.Reduce(c, c) // canonical residues for the CRT
	q0, q1 := rq.SubRings[0].Modulus, rq.SubRings[1].Modulus
	inv := r.s.q0Inv
	qHi, qLo := bits.Mul64(q0, q1)
	halfHi, halfLo := qHi>>1, qLo>>1|qHi<<63
	out := make([]byte, r.shareBytes())
	for j, r0 := range c.Coeffs[0] {
		r1 := c.Coeffs[1][j]
		d := r1 + q1 - r0%q1
		hi, lo := bits.Mul64(d%q1, inv)
		u := bits.Rem64(hi, lo, q1)
		hi, lo = bits.Mul64(q0, u)
		var carry uint64
		lo, carry = bits.Add64(lo, r0, 0)
		hi += carry
		if hi > halfHi || hi == halfHi && lo >= halfLo { // x ≥ Q/2: x − Q, negative
			lo, carry = bits.Sub64(lo, qLo, 0)
			hi = hi - qHi - carry
		}
		lo, carry = bits.Add64(lo, 1<<(shareDrop-1), 0) // round to nearest
		hi += carry
		w := out[j*shareWordBytes:]
		binary.LittleEndian.PutUint64(w, lo>>shareDrop|hi<<(64-shareDrop))
		w[8] = byte(int64(hi) >> shareDrop) // arithmetic: the sign-extended top byte
	}
	return out
}

// unmarshalShare decodes a rounded partial decryption into a polynomial of
// the round's ring (NTT domain). Any bytes of the right length decode.
func (r *round) unmarshalShare(b []byte) (ring.Poly, error) {
	rq := r.s.params.RingQ()
	if len(b) != r.shareBytes() {
		return ring.Poly{}, malformed("decrypt share", "%d bytes, want %d", len(b), r.shareBytes())
	}
	p := rq.NewPoly()
	for j := range rq.N() {
		w := b[j*shareWordBytes:]
		lo64 := binary.LittleEndian.Uint64(w)
		top := int64(int8(w[8]))
		// X = y·2^shareDrop as a signed 128-bit (hi, lo).
		hi := uint64(top)<<shareDrop | lo64>>(64-shareDrop)
		lo := lo64 << shareDrop
		neg := int64(hi) < 0
		if neg { // |X|
			var borrow uint64
			lo, borrow = bits.Sub64(0, lo, 0)
			hi, _ = bits.Sub64(0, hi, borrow)
		}
		for i, sr := range rq.SubRings {
			v := bits.Rem64(hi, lo, sr.Modulus)
			if neg && v != 0 {
				v = sr.Modulus - v
			}
			p.Coeffs[i][j] = v
		}
	}
	rq.NTT(p, p)
	return p, nil
}
