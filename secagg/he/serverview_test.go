package he

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/tuneinsight/lattigo/v5/core/rlwe"
	"github.com/tuneinsight/lattigo/v5/he/heint"
	"github.com/tuneinsight/lattigo/v5/mhe"
	"github.com/tuneinsight/lattigo/v5/ring"
)

// TestServerView takes everything the aggregator receives in a round —
// adverts, signed key shares with sealed boxes, ciphertexts, partial
// decryptions — and checks what it can make of it without a key share:
// each ciphertext, opened with the only key it has (zero), decodes to
// residues that agree with the input nowhere and whose coefficients are
// as uniform as those of an encryption of zero; t−1 partial decryptions
// of the sum decode to nothing like the sum; and no 8-byte stretch of any
// input appears in any message. The full t decrypt the sum exactly.
func TestServerView(t *testing.T) {
	const n, dim = 5, 2000 // t = 3
	p, keys := testRound(t, n, dim, 1<<20)
	inputs := randInputs(t, n, dim, p.Bound)
	var msgs [][]byte
	var cts []*Ciphertext
	var shares []*DecryptShare
	d := drive{view: func(kind, from string, b []byte) {
		msgs = append(msgs, b)
		switch kind {
		case "ciphertext":
			cts = append(cts, must(ParseCiphertext(b)))
		case "decrypt share":
			shares = append(shares, must(ParseDecryptShare(b)))
		}
	}}
	res, err := d.run(t, p, keys, inputs)
	if err != nil {
		t.Fatal(err)
	}
	r := must(newRound(p))
	params := r.s.params
	ecd := heint.NewEncoder(params)
	zeroDec := rlwe.NewDecryptor(params, rlwe.NewSecretKey(params))
	decode := func(ct *rlwe.Ciphertext) []int64 {
		pt := r.newPlaintext()
		zeroDec.Decrypt(ct, pt)
		pt.IsBatched = false
		out := make([]int64, r.s.slots)
		if err := ecd.Decode(pt, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// unpacked reads the lanes of ciphertext 0's coefficients as the
	// round does (an undecryptable sum still yields lanes to compare).
	unpacked := func(vals []int64) []int64 {
		out := make([]int64, dim)
		_ = r.unpack(out, vals, 0)
		return out
	}
	agreeing := func(a, b []int64) int {
		k := 0
		for i := range a {
			if a[i] == b[i] {
				k++
			}
		}
		return k
	}

	// 1. Each ciphertext alone, with the round's public polynomial.
	eval := heint.NewEvaluator(params, nil)
	var sum *rlwe.Ciphertext
	a := r.uniform()[0]
	for i, m := range cts {
		ct := r.ciphertext(must(r.unmarshalPoly("c0", m.C0[0])), a)
		if k := agreeing(unpacked(decode(ct)), inputs[i]); k > 0 {
			t.Errorf("ciphertext of %s opened with the zero key agrees with its input at %d of %d values", m.From, k, dim)
		}
		if sum == nil {
			sum = ct.CopyNew()
		} else if err := eval.Add(sum, ct, sum); err != nil {
			t.Fatal(err)
		}
		// Compared with an encryption of zero under the same kind of key:
		// both look uniform modulo q (top-nibble histogram, χ² with 15
		// degrees of freedom below 60: p < 1e-6 for a uniform source).
		if chi := topNibbleChi2(params.RingQ(), ct.Value[0]); chi > 60 {
			t.Errorf("ciphertext of %s: coefficients far from uniform (χ² = %.1f)", m.From, chi)
		}
	}
	zsk := rlwe.NewKeyGenerator(params).GenSecretKeyNew()
	zct := r.newCiphertext()
	if err := rlwe.NewEncryptor(params, zsk).Encrypt(r.newPlaintext(), zct); err != nil {
		t.Fatal(err)
	}
	if chi := topNibbleChi2(params.RingQ(), zct.Value[0]); chi > 60 {
		t.Errorf("the encryption of zero itself fails the uniformity check (χ² = %.1f): the check is broken", chi)
	}

	// 2. Fewer than t partial decryptions of the sum.
	cks := must(mhe.NewKeySwitchProtocol(params, r.s.smudge))
	combineDecode := func(ds []*DecryptShare) []int64 {
		agg := cks.AllocateShare(params.MaxLevel())
		for _, s := range ds {
			if err := cks.AggregateShares(agg, mhe.KeySwitchShare{Value: must(r.unmarshalShare(s.Shares[0]))}, &agg); err != nil {
				t.Fatal(err)
			}
		}
		out := r.newCiphertext()
		cks.KeySwitch(sum, agg, out)
		return decode(out)
	}
	if len(shares) != r.t {
		t.Fatalf("%d partial decryptions seen, want t = %d", len(shares), r.t)
	}
	if got := unpacked(combineDecode(shares)); !slices.Equal(got, res.Sum) {
		t.Fatal("the t partial decryptions the aggregator saw do not open the sum: the test is not looking at the real view")
	}
	for drop := range shares {
		fewer := slices.Delete(slices.Clone(shares), drop, drop+1)
		if k := agreeing(unpacked(combineDecode(fewer)), res.Sum); k > 0 {
			t.Errorf("%d of t partial decryptions agree with the sum at %d of %d values", len(fewer), k, dim)
		}
	}

	// 3. No plaintext bytes in any message.
	for i, in := range inputs {
		for j := 0; j+1 < len(in); j += 97 {
			var w [8]byte
			binary.LittleEndian.PutUint64(w[:], uint64(in[j]))
			for _, m := range msgs {
				if bytes.Contains(m, w[:]) {
					t.Fatalf("input %d value %d appears in a message", i, j)
				}
			}
		}
	}
}

// topNibbleChi2 is the χ² statistic of the top four bits of the
// coefficients (scaled by each modulus) against the uniform distribution.
func topNibbleChi2(rq *ring.Ring, polys ...ring.Poly) float64 {
	var hist [16]float64
	total := 0.0
	for _, p := range polys {
		for i, c := range p.Coeffs {
			q := float64(rq.SubRings[i].Modulus)
			for _, v := range c {
				hist[int(math.Min(15, float64(v)/q*16))]++
				total++
			}
		}
	}
	chi := 0.0
	for _, h := range hist {
		e := total / 16
		chi += (h - e) * (h - e) / e
	}
	return chi
}
