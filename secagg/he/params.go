package he

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"math/big"
	"slices"
	"sync"

	"github.com/tuneinsight/lattigo/v5/he/heint"
	"github.com/tuneinsight/lattigo/v5/ring"
	"github.com/tuneinsight/lattigo/v5/ring/ringqp"
	"github.com/tuneinsight/lattigo/v5/utils/sampling"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// Scheme names the lattice parameters below; it is bound into every
// round's digest, so sites on other parameters refuse each other.
const Scheme = "bgv-n13-q120-t60-sk-lanes/v2"

// The BGV parameters. Only additions are evaluated, so one level suffices:
// Q holds T times the noise of the sum (at most 255 fresh encryptions)
// plus t ≤ 255 smudging terms of bound 6σ and the rounding of t partial
// decryptions (≤ 2^47 each, lattice.go), with a margin of 2^4.8:
// log2(T·255·(6σ + 2^47)) ≈ 60 + 8 + 47.1 ≈ 115.1 < 119. N = 2^13 with log Q = 120
// is within the HomomorphicEncryption.org table for 128-bit security
// (log QP ≤ 218 at N = 2^13, ternary secrets); T does not enter the
// security of RLWE.
const (
	logN = 13
	// tBits is the size of the plaintext modulus T, an NTT-friendly prime
	// (T ≡ 1 mod 2N) just below 2^60: the largest lattigo's uint64
	// arithmetic modulo T takes with room, so that one coefficient packs
	// as many coordinates as their sum's width allows (lanes); the
	// signed packed sum must stay within ±(T−1)/2.
	tBits = 60
	// smudgeSigma is the standard deviation of the noise each decrypting
	// site adds to its partial decryption: 2^40, about 2^25 times the
	// encryption noise of a sum of ten sites (≈ 2^15), so a partial
	// decryption does not expose the key-dependent noise.
	smudgeSigma = 1 << 40
)

var logQ = []int{60, 60}

// Limits, as for masking.
const (
	MinSites = secagg.MinSites
	MaxSites = secagg.MaxSites
	MaxDim   = 1 << 24 // at most 2048 ciphertexts of 2^13 coefficients: 256 MiB per site
	seedLen  = 32
)

// scheme is the lattigo side of Scheme, built once.
type scheme struct {
	params heint.Parameters
	t      uint64 // plaintext modulus
	slots  int    // values per ciphertext (N)
	c1Size int    // bytes of one marshalled ring polynomial at the top level
	skSize int    // bytes of one marshalled Shamir share
	q0Inv  uint64 // q0⁻¹ mod q1, for the CRT of rounded shares
	smudge ring.DiscreteGaussian
}

var (
	schemeOnce sync.Once
	schemeVal  *scheme
	schemeErr  error
)

func getScheme() (*scheme, error) {
	schemeOnce.Do(func() {
		// T is the first NTT-friendly prime below 2^tBits that is not one
		// of Q's primes (lattigo draws those near 2^60 too, and refuses
		// T | Q).
		g := ring.NewNTTFriendlyPrimesGenerator(tBits, 2<<logN)
		var p heint.Parameters
		var t uint64
		err := fmt.Errorf("no plaintext modulus found")
		for range 8 {
			if t, err = g.NextDownstreamPrime(); err != nil {
				break
			}
			if p, err = heint.NewParametersFromLiteral(heint.ParametersLiteral{LogN: logN, LogQ: logQ, PlaintextModulus: t}); err == nil {
				break
			}
		}
		if err != nil {
			schemeErr = err
			return
		}
		s := &scheme{params: p, t: t, slots: p.N(), smudge: ring.DiscreteGaussian{Sigma: smudgeSigma, Bound: 6 * smudgeSigma}}
		s.c1Size = p.RingQ().NewPoly().BinarySize()
		s.skSize = p.RingQP().NewPoly().BinarySize()
		q := p.Q()
		if len(q) != 2 {
			schemeErr = fmt.Errorf("%d primes in Q; the rounded shares join two", len(q))
			return
		}
		s.q0Inv = new(big.Int).ModInverse(new(big.Int).SetUint64(q[0]), new(big.Int).SetUint64(q[1])).Uint64()
		schemeVal = s
	})
	return schemeVal, schemeErr
}

// MaxSum is the largest magnitude the decrypted sum can hold: lattigo
// decodes residues of ⌊T/2⌋ and above as negative, so ⌊T/2⌋ − 1.
func MaxSum() int64 {
	s, err := getScheme()
	if err != nil {
		panic("he: lattigo parameters: " + err.Error())
	}
	return int64(s.t>>1) - 1
}

// Slots is how many coefficients one ciphertext carries; each holds
// Params.Lanes() values.
func Slots() int { return 1 << logN }

// lanesFor returns how many values of |y| ≤ bound one plaintext
// coefficient carries for n sites, and the width w of each lane in bits.
// A lane holds the sum of n values, within ±n·bound < 2^(w−1), so
// centred residues modulo 2^w read the lanes back exactly; the packed
// sum Σ_l s_l·2^(w·l) must stay within ±MaxSum(). One lane (w unused)
// is the unpacked layout, valid whenever n·bound ≤ MaxSum().
func lanesFor(n int, bound int64) (lanes, w int) {
	if n < 1 || bound < 1 {
		return 1, 0
	}
	sum := new(big.Int).Mul(big.NewInt(int64(n)), big.NewInt(bound)) // n·bound
	w = sum.BitLen() + 1
	limit := big.NewInt(MaxSum())
	lanes = 1
	for {
		// The packed sum's bound with one more lane: n·bound·Σ_{l≤lanes} 2^(w·l).
		total := new(big.Int)
		for l := 0; l <= lanes; l++ {
			total.Add(total, new(big.Int).Lsh(sum, uint(w*l)))
		}
		if total.Cmp(limit) > 0 {
			return lanes, w
		}
		lanes++
	}
}

// Params are the round's public parameters; every party and the
// aggregator of a round hold equal Params.
type Params struct {
	// Round names the round; it travels in every message.
	Round string `cbor:"round"`
	// Members are the sites allowed to take part (3 to 255), with their
	// Ed25519 identity keys. Order does not matter.
	Members []secagg.Member `cbor:"members"`
	// Threshold t: how many sites decrypt the sum; secret keys are
	// Shamir-shared t-of-n. Zero means ⌊n/2⌋+1; an explicit value must
	// exceed n/2 (so that no two disjoint coalitions of t exist) and be at
	// most n.
	Threshold int `cbor:"threshold"`
	// Dim is the length of each encoded input vector.
	Dim int `cbor:"dim"`
	// Bound bounds every encoded value: |y_i| ≤ Bound. n·Bound must not
	// exceed MaxSum(), so the sum of all members cannot wrap.
	Bound int64 `cbor:"bound"`
	// Seed is the round's public seed (32 bytes): the common reference
	// string (the ciphertexts' public polynomials) is derived from it.
	Seed []byte `cbor:"seed"`
}

// round is the validated, derived form of Params.
type round struct {
	p       Params
	s       *scheme
	n, t    int
	floor   int // max(MinSites, t)
	ids     []string
	keys    map[string]ed25519.PublicKey
	points  map[string]uint64 // Shamir point: rank + 1
	cts     int               // ciphertexts per input
	lanes   int               // values per plaintext coefficient
	laneW   int               // bits per lane (when lanes > 1)
	session []byte            // digest of the params and the scheme
}

type paramsWire struct {
	Domain    string          `cbor:"domain"`
	Scheme    string          `cbor:"scheme"`
	T         uint64          `cbor:"t"`
	Round     string          `cbor:"round"`
	Members   []secagg.Member `cbor:"members"`
	Threshold int             `cbor:"threshold"`
	Dim       int             `cbor:"dim"`
	Bound     int64           `cbor:"bound"`
	Seed      []byte          `cbor:"seed"`
}

func newRound(p Params) (*round, error) {
	subject := fmt.Sprintf("threshold-he round %q", p.Round)
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.SecAggBadParams, subject, format, args...)
	}
	s, err := getScheme()
	if err != nil {
		return nil, bad("the lattice parameters cannot be built: %v", err)
	}
	if p.Round == "" || len(p.Round) > 256 {
		return nil, bad("round ID must be 1 to 256 bytes")
	}
	n := len(p.Members)
	if n < MinSites {
		return nil, diag.New(diag.SecAggTooFewSites, subject, "%d member sites; threshold-he aggregation needs at least %d", n, MinSites).
			WithHelp("with two sites each could subtract its own update from the sum and learn the other's; add sites or do not aggregate")
	}
	if n > MaxSites {
		return nil, bad("%d member sites; at most %d are supported", n, MaxSites)
	}
	r := &round{p: p, s: s, n: n, keys: make(map[string]ed25519.PublicKey, n), points: make(map[string]uint64, n)}
	for _, m := range p.Members {
		if m.ID == "" || len(m.ID) > secagg.MaxIDLength {
			return nil, bad("member ID %q must be 1 to %d bytes", m.ID, secagg.MaxIDLength)
		}
		if len(m.Key) != ed25519.PublicKeySize {
			return nil, bad("member %q has a %d-byte identity key, want %d", m.ID, len(m.Key), ed25519.PublicKeySize)
		}
		if _, dup := r.keys[m.ID]; dup {
			return nil, bad("member %q is listed twice", m.ID)
		}
		for id, k := range r.keys {
			if bytes.Equal(k, m.Key) {
				return nil, bad("members %q and %q share an identity key", id, m.ID)
			}
		}
		r.keys[m.ID] = m.Key
		r.ids = append(r.ids, m.ID)
	}
	slices.Sort(r.ids)
	for i, id := range r.ids {
		r.points[id] = uint64(i + 1)
	}
	r.t = p.Threshold
	if r.t == 0 {
		r.t = n/2 + 1
	}
	if 2*r.t <= n || r.t > n {
		return nil, diag.New(diag.SecAggBadThreshold, subject, "threshold %d with %d sites; want more than %d and at most %d", p.Threshold, n, n/2, n).
			WithHelp("use 0 for the default ⌊n/2⌋+1: with t ≤ n/2 two disjoint coalitions could each decrypt a different ciphertext")
	}
	r.floor = max(MinSites, r.t)
	if p.Dim < 1 || p.Dim > MaxDim {
		return nil, bad("dimension %d; want 1 to %d", p.Dim, MaxDim)
	}
	if p.Bound < 1 || p.Bound > MaxSum()/int64(n) {
		return nil, bad("bound %d with %d sites; want 1 to %d so the sum cannot wrap modulo T (≈2^%d)", p.Bound, n, MaxSum()/int64(n), tBits).
			WithHelp("choose a coarser grid (fewer fraction bits) or a smaller clip")
	}
	r.lanes, r.laneW = lanesFor(n, p.Bound)
	r.cts = p.Ciphertexts()
	if len(p.Seed) != seedLen {
		return nil, bad("seed of %d bytes; want %d", len(p.Seed), seedLen).WithHelp("derive the round seed from the round's public seed")
	}
	members := make([]secagg.Member, n)
	for i, id := range r.ids {
		members[i] = secagg.Member{ID: id, Key: r.keys[id]}
	}
	b, err := content.Encode(paramsWire{Domain: "scellis/he/v1/params", Scheme: Scheme, T: s.t, Round: p.Round, Members: members,
		Threshold: r.t, Dim: p.Dim, Bound: p.Bound, Seed: p.Seed})
	if err != nil {
		return nil, bad("%v", err)
	}
	sum := sha256.Sum256(b)
	r.session = sum[:]
	return r, nil
}

// Validate reports whether p is a valid round (a diagnostic if not).
func (p Params) Validate() error {
	_, err := newRound(p)
	return err
}

// Digest is the session digest of p: bound into every signature and box.
func (p Params) Digest() ([]byte, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	return slices.Clone(r.session), nil
}

// EffectiveThreshold returns t (the default when Threshold is 0).
func (p Params) EffectiveThreshold() (int, error) {
	r, err := newRound(p)
	if err != nil {
		return 0, err
	}
	return r.t, nil
}

// BoundFor returns the largest per-site bound a round of n sites can use.
func BoundFor(n int) int64 {
	if n < 1 {
		return 0
	}
	return MaxSum() / int64(n)
}

func (r *round) subject() string { return fmt.Sprintf("threshold-he round %q", r.p.Round) }

// crs is the common reference string: a keyed PRNG on the session digest
// (which covers the public round seed), identical for every party. Its
// stream is the ciphertexts' public polynomials a_0, a_1, …, one per
// ciphertext index, drawn in order (uniform below).
func (r *round) crs() sampling.PRNG {
	k := sha256.Sum256(append([]byte("scellis/he/v2/crs\x00"), r.session...))
	prng, err := sampling.NewKeyedPRNG(k[:])
	if err != nil {
		panic("he: keyed PRNG: " + err.Error())
	}
	return prng
}

// uniform returns the round's public polynomials a_0 … a_{cts−1}: what
// every site's encryptor draws as c1 from the CRS (rlwe.Encryptor.WithPRNG
// with the same sampler), so nobody sends them.
func (r *round) uniform() []ring.Poly {
	params := r.s.params
	us := ringqp.NewUniformSampler(r.crs(), *params.RingQP()).AtLevel(params.MaxLevel(), -1)
	out := make([]ring.Poly, r.cts)
	for k := range out {
		out[k] = params.RingQ().NewPoly()
		us.Read(ringqp.Poly{Q: out[k]})
	}
	return out
}

func (r *round) checkRound(got string) error {
	if got != r.p.Round {
		return diag.New(diag.SecAggWrongRound, r.subject(), "a message of round %q", got).
			WithHelp("every message carries its round ID; this one belongs to another round")
	}
	return nil
}

// PolyBytes is the size of one marshalled ring polynomial: a ciphertext
// (its c0: c1 is the CRS's), a partial decryption and a key share are
// one each. Transports bound their bodies with it.
func PolyBytes() int {
	s, err := getScheme()
	if err != nil {
		panic("he: lattigo parameters: " + err.Error())
	}
	return max(s.c1Size, s.skSize)
}

// Lanes returns how many values one plaintext coefficient of the round
// carries: as many lanes of the sum's width (n·Bound, signed) as fit
// below T/2.
func (p Params) Lanes() int {
	l, _ := lanesFor(len(p.Members), p.Bound)
	return l
}

// Ciphertexts returns how many ciphertexts carry an input of p.Dim values.
func (p Params) Ciphertexts() int {
	per := Slots() * p.Lanes()
	return (p.Dim + per - 1) / per
}
