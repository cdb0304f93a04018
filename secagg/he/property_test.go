package he

import (
	"crypto/rand"
	"math/big"
	"slices"
	"testing"

	"github.com/tuneinsight/lattigo/v5/ring"
	"github.com/tuneinsight/lattigo/v5/utils/sampling"

	"github.com/scellis/scellis/diag"
)

func randInputs(t testing.TB, n, dim int, bound int64) [][]int64 {
	out := make([][]int64, n)
	span := big.NewInt(2*bound + 1)
	for i := range out {
		out[i] = make([]int64, dim)
		for j := range out[i] {
			v, err := rand.Int(rand.Reader, span)
			if err != nil {
				t.Fatal(err)
			}
			out[i][j] = v.Int64() - bound
		}
		// The extremes, so the test covers the edge of the ring.
		out[i][0], out[i][dim-1] = bound, -bound
	}
	return out
}

func plainSum(inputs [][]int64, skip map[string]bool, ids func(int) string) []int64 {
	sum := make([]int64, len(inputs[0]))
	for i, in := range inputs {
		if skip[ids(i)] {
			continue
		}
		for j, v := range in {
			sum[j] += v
		}
	}
	return sum
}

// TestDecryptedSumIsExact checks the decrypted sum against the plaintext
// sum of the encoded inputs, exactly, for random inputs up to the bound
// with n from 3 to 10, at the widest bound (one value per coefficient)
// and at ±2^20 (packed: two or more lanes per coefficient), a vector
// spanning two ciphertexts, and dropouts after key sharing and after
// encryption (the sum then holds fewer keys than were shared).
func TestDecryptedSumIsExact(t *testing.T) {
	for n := 3; n <= 10; n++ {
		if raceEnabled && n != 6 {
			continue
		}
		for _, bound := range []int64{BoundFor(n), 1 << 20} {
			dim := 300
			if n == 10 {
				dim = Slots() + 17 // two ciphertexts unpacked, the second mostly padding
			}
			p, keys := testRound(t, n, dim, bound)
			if bound == 1<<20 {
				if p.Lanes() < 2 {
					t.Fatalf("n=%d: ±2^20 inputs take %d lane, want 2 or more", n, p.Lanes())
				}
				if n == 10 {
					p.Dim = Slots()*p.Lanes() + 17 // two packed ciphertexts
				}
			}
			inputs := randInputs(t, n, p.Dim, p.Bound)
			id := func(i int) string { return p.Members[i].ID }
			var d drive
			if n >= 5 {
				// One site drops after sharing keys, and the first decryptor
				// dies after encrypting: the sum holds n−1 sites and a second
				// attempt decrypts it.
				d.dropAfterShare = map[string]bool{id(n - 1): true}
				d.dropAfterEncrypt = map[string]bool{id(0): true}
			}
			res, err := d.run(t, p, keys, inputs)
			if err != nil {
				t.Fatalf("n=%d bound=%d: %v", n, bound, err)
			}
			want := plainSum(inputs, d.dropAfterShare, id)
			if !slices.Equal(res.Sum, want) {
				t.Fatalf("n=%d bound=%d (%d lanes): decrypted sum differs from the plaintext sum: %v vs %v", n, bound, p.Lanes(), res.Sum[:4], want[:4])
			}
			if n >= 5 && (len(res.Contributors) != n-1 || !slices.Equal(res.Dropped, []string{id(n - 1)}) || slices.Contains(res.Decryptors, id(0))) {
				t.Fatalf("n=%d: contributors %v dropped %v decryptors %v", n, res.Contributors, res.Dropped, res.Decryptors)
			}
		}
	}
}

// TestLanes checks the packing arithmetic at its edges: every lane at
// ±n·bound (the extremes the sum of n sites reaches) reads back exactly,
// the packed sum stays within ±MaxSum, and one more lane would not.
func TestLanes(t *testing.T) {
	for _, c := range []struct {
		n     int
		bound int64
		lanes int
	}{
		{3, 1 << 20, 2}, {10, 1 << 20, 2}, {3, 1 << 13, 3}, {255, 1 << 20, 2}, {255, 1 << 24, 1}, {3, 1000, 4}, {10, BoundFor(10), 1},
	} {
		lanes, w := lanesFor(c.n, c.bound)
		if lanes != c.lanes {
			t.Errorf("n=%d bound=%d: %d lanes, want %d", c.n, c.bound, lanes, c.lanes)
		}
		r := &round{lanes: lanes, laneW: w}
		sumBound := int64(c.n) * c.bound
		for _, sign := range []int64{1, -1} {
			vals := make([]int64, 2*lanes) // two coefficients: all at +, alternating
			for i := range vals {
				vals[i] = sign * sumBound
				if i >= lanes && i%2 == 1 {
					vals[i] = -vals[i]
				}
			}
			packed := make([]int64, 2)
			r.pack(packed, vals, 0)
			for _, v := range packed {
				if v > MaxSum() || v < -MaxSum() {
					t.Errorf("n=%d bound=%d: packed sum %d beyond ±%d", c.n, c.bound, v, MaxSum())
				}
			}
			got := make([]int64, len(vals))
			if err := r.unpack(got, packed, 0); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, vals) {
				t.Errorf("n=%d bound=%d: lanes %v read back as %v", c.n, c.bound, vals, got)
			}
		}
	}
}

// TestBelowThresholdRefused: too many sites die after encrypting — the
// round ends with SC6004 and no sum.
func TestBelowThresholdRefused(t *testing.T) {
	p, keys := testRound(t, 5, 10, 1000) // t = 3
	inputs := randInputs(t, 5, 10, 1000)
	d := drive{dropAfterEncrypt: map[string]bool{"site-00": true, "site-01": true, "site-02": true}}
	res, err := d.run(t, p, keys, inputs)
	if res != nil || !hasCode(err, diag.SecAggBelowThreshold) {
		t.Fatalf("want SC6004 and no sum, got %v, %v", res, err)
	}
}

func hasCode(err error, c diag.Code) bool {
	ds, ok := diag.As(err)
	if !ok {
		return false
	}
	for _, d := range ds {
		if d.Code == c {
			return true
		}
	}
	return false
}

// TestShareRounding checks the rounded encoding of partial decryptions
// against lattigo's own CRT (ring.PolyToBigintCentered): a decoded
// polynomial differs from the original by at most 2^(shareDrop−1) in
// every coefficient, for uniform polynomials and for the extremes ±Q/2,
// 0 and ±1, and every coefficient takes shareWordBytes bytes.
func TestShareRounding(t *testing.T) {
	p, _ := testRound(t, 3, 10, 1)
	r := must(newRound(p))
	rq := r.s.params.RingQ()
	prng := must(sampling.NewPRNG())
	us := ring.NewUniformSampler(prng, rq)
	polys := []ring.Poly{us.ReadNew(), us.ReadNew()}
	// Extremes, set in the coefficient domain: ⌊Q/2⌋, ⌈Q/2⌉, 0, 1, −1.
	q := rq.ModulusAtLevel[rq.Level()]
	half := new(big.Int).Rsh(q, 1)
	edge := []*big.Int{half, new(big.Int).Add(half, big.NewInt(1)), big.NewInt(0), big.NewInt(1), new(big.Int).Sub(q, big.NewInt(1))}
	coeffs := make([]*big.Int, rq.N())
	for i := range coeffs {
		coeffs[i] = edge[i%len(edge)]
	}
	e := rq.NewPoly()
	rq.SetCoefficientsBigint(coeffs, e)
	rq.NTT(e, e)
	polys = append(polys, e)
	bound := new(big.Int).Lsh(big.NewInt(1), shareDrop-1)
	for _, x := range polys {
		b := r.marshalShare(x)
		if len(b) != shareWordBytes*rq.N() {
			t.Fatalf("%d bytes, want %d", len(b), shareWordBytes*rq.N())
		}
		y := must(r.unmarshalShare(b))
		d := rq.NewPoly()
		rq.Sub(y, x, d)
		rq.INTT(d, d)
		diff := make([]*big.Int, rq.N())
		for i := range diff {
			diff[i] = new(big.Int)
		}
		rq.PolyToBigintCentered(d, 1, diff)
		for i, v := range diff {
			if new(big.Int).Abs(v).Cmp(bound) > 0 {
				t.Fatalf("coefficient %d moved by %v, more than 2^%d", i, v, shareDrop-1)
			}
		}
	}
}
