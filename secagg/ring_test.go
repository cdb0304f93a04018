package secagg

import (
	"bytes"
	"math"
	"math/big"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
)

func TestFracBitsLeaveHeadroom(t *testing.T) {
	for _, n := range []int{3, 7, 20, 255} {
		for _, clip := range []float64{1e-9, 0.5, 1, 3, 10, 1e6, 1e15} {
			f, ok := fracBitsFor(clip, n)
			if !ok {
				t.Fatalf("n=%d clip=%v: no fraction bits", n, clip)
			}
			// Exact check with big integers: n·(clip·2^f + 1) ≤ 2^62 < 2^63.
			limit := new(big.Float).SetInt(new(big.Int).Lsh(big.NewInt(1), 62))
			worst := func(f int) *big.Float {
				v := new(big.Float).SetMantExp(big.NewFloat(clip), f)
				v.Add(v, big.NewFloat(1))
				return v.Mul(v, big.NewFloat(float64(n)))
			}
			if worst(f).Cmp(limit) > 0 {
				t.Errorf("n=%d clip=%v f=%d: sum can reach past 2^62", n, clip, f)
			}
			if f < maxFracBits && worst(f+1).Cmp(limit) <= 0 {
				t.Errorf("n=%d clip=%v f=%d: f+1 would also fit", n, clip, f)
			}
		}
	}
	for _, clip := range []float64{0, -1, math.NaN(), math.Inf(1), 0x1p61} {
		if _, ok := fracBitsFor(clip, 3); ok {
			t.Errorf("clip %v accepted", clip)
		}
	}
}

func TestEncodeRoundsToANeighbour(t *testing.T) {
	r, _ := newRounder(AESCTR)
	for _, f := range []int{0, 3, 20, 56} {
		for _, x := range []float64{0, 1, -1, 0.1, -0.1, 1.0 / 3, -2.75, 7.999, -1e-9} {
			v := math.Ldexp(x, f)
			lo, hi := math.Floor(v), math.Ceil(v)
			for range 50 {
				got := float64(int64(encodeValue(x, math.Ldexp(1, f), r)))
				if got != lo && got != hi {
					t.Fatalf("encode(%v, f=%d) = %v, not %v or %v", x, f, got, lo, hi)
				}
			}
		}
	}
	// Exactly representable values encode exactly, negative ones as
	// two's complement.
	for _, x := range []float64{-1.5, 0.25, -0.125, 3, -10} {
		if got := decodeValue(encodeValue(x, math.Ldexp(1, 40), r), 40); got != x {
			t.Fatalf("decode(encode(%v)) = %v", x, got)
		}
	}
}

// TestStochasticRoundingIsUnbiased: E[encode(x)] = x·2^f.
func TestStochasticRoundingIsUnbiased(t *testing.T) {
	r, _ := newRounder(ChaCha20)
	const trials = 40000
	for _, x := range []float64{0.1, -0.1, 0.7, 1.0 / 3} {
		f := 2
		v := math.Ldexp(x, f)
		p := v - math.Floor(v)
		var sum float64
		for range trials {
			sum += float64(int64(encodeValue(x, math.Ldexp(1, f), r))) - math.Floor(v)
		}
		mean, sd := sum/trials, math.Sqrt(p*(1-p)/trials)
		if math.Abs(mean-p) > 6*sd {
			t.Errorf("x=%v: rounded up %.4f of the time, want %.4f ± %.4f", x, mean, p, sd)
		}
	}
}

// TestExtremesDoNotWrap: n clients all at +clip (or all at −clip) still
// decode to n·clip.
func TestExtremesDoNotWrap(t *testing.T) {
	r, _ := newRounder(AESCTR)
	for _, n := range []int{3, 30, 255} {
		for _, clip := range []float64{1, 123.456, 1e12} {
			f, _ := fracBitsFor(clip, n)
			for _, sign := range []float64{1, -1} {
				var acc uint64
				for range n {
					acc += encodeValue(sign*clip, math.Ldexp(1, f), r)
				}
				got, want := decodeValue(acc, f), sign*clip*float64(n)
				if math.Abs(got-want) > float64(n)*math.Ldexp(1, -f)+math.Abs(want)*0x1p-52 {
					t.Errorf("n=%d clip=%v: %d × %v decodes to %v", n, clip, n, sign*clip, got)
				}
			}
		}
	}
}

// Inputs a site put on the grid itself (MaskEncoded, the path for noise
// added on the integers) sum exactly, mixed with inputs encoded by the
// client; a value beyond the round's per-site bound is refused, and so is
// a grid finer than the ring's headroom allows.
func TestMaskEncodedSumsExactly(t *testing.T) {
	p := testParams("enc", 5, 0, 6, 10)
	p.GridBits = 8
	bound, err := p.EncodedBound()
	if err != nil || bound != 2560 {
		t.Fatalf("encoded bound %d %v, want 10·2^8", bound, err)
	}
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	h.enc = map[string][]int64{}
	want := make([]float64, p.Dim)
	for k, id := range h.ids {
		if k == 4 { // one client sends floats, on the same grid
			for i, v := range h.inputs[id] {
				h.inputs[id][i] = math.Ldexp(math.Round(math.Ldexp(v, 8)), -8) // on the grid: no rounding
				want[i] += h.inputs[id][i]
			}
			continue
		}
		y := make([]int64, p.Dim)
		for i := range y {
			y[i] = int64((k*7+i*13)%5121) - 2560
			if k == 0 && i == 0 {
				y[i] = -bound
			}
			want[i] += math.Ldexp(float64(y[i]), -8)
		}
		h.enc[id] = y
		h.inputs[id] = nil
		for _, v := range y {
			h.inputs[id] = append(h.inputs[id], math.Ldexp(float64(v), -8))
		}
	}
	if !h.run() {
		t.Fatalf("round refused:\n%s", h.out.String())
	}
	for i, v := range h.result.Sum {
		if v != want[i] {
			t.Fatalf("sum[%d] = %v, want exactly %v", i, v, want[i])
		}
	}
	c, _ := NewClient(p, h.ids[0], identity(h.ids[0]))
	wantCode(t, c.CheckEncoded([]int64{0, 0, bound + 1, 0, 0, 0}, 0), diag.SecAggOutOfRange)
	wantCode(t, c.CheckEncoded([]int64{0, 0}, 0), diag.SecAggWrongLength)
	p.GridBits = 60 // 5·(10·2^60) does not fit below 2^62
	_, err = NewClient(p, h.ids[0], identity(h.ids[0]))
	wantCode(t, err, diag.SecAggBadParams)
}

// TestNarrowRingOnlyWhenBoundHolds is the regression test of the ring
// choice (not timed): Z_2^32 is used exactly when the bound on the sum,
// n·(⌊Clip·2^f⌋ + 1), is at most 2^31 − 1, checked against big integers on
// both sides of the boundary; and rounds at the boundary, every site
// sending the extreme value of its bound (both signs), sum exactly in the
// ring chosen, weighted or not. A derived grid fills 62 bits, so it always
// runs in Z_2^64.
func TestNarrowRingOnlyWhenBoundHolds(t *testing.T) {
	const f = 20
	limit := big.NewInt(math.MaxInt32)
	fits := func(n int, clip float64) bool {
		eb := new(big.Int).SetInt64(int64(math.Floor(math.Ldexp(clip, f))))
		s := new(big.Int).Mul(big.NewInt(int64(n)), eb.Add(eb, big.NewInt(1)))
		return s.Cmp(limit) <= 0
	}
	for _, n := range []int{3, 7, 100, 255} {
		edge := math.MaxInt32/int64(n) - 1 // the largest encoded bound that fits
		for _, eb := range []int64{0, 1, edge - 1, edge, edge + 1, edge + 2, 1 << 40} {
			clip := math.Ldexp(float64(eb)+0.5, -f) // ⌊clip·2^f⌋ = eb
			p := testParams("ring", n, 0, 2, clip)
			p.GridBits = f
			got, err := p.RingBits()
			if err != nil {
				t.Fatalf("n=%d eb=%d: %v", n, eb, err)
			}
			if want := map[bool]int{true: 32, false: 64}[fits(n, clip)]; got != want {
				t.Errorf("n=%d, encoded bound %d: ring Z_2^%d, want Z_2^%d", n, eb, got, want)
			}
		}
		p := testParams("ring", n, 0, 2, 1) // derived grid
		if got, _ := p.RingBits(); got != 64 {
			t.Errorf("n=%d, derived grid: ring Z_2^%d, want Z_2^64", n, got)
		}
	}
	// Rounds at the boundary: the extreme sums come out exact, in both
	// halves of a 32-bit pair of like and of opposite signs, and in a last
	// odd coordinate; 13 coordinates, so the first eight go through the
	// AVX2 kernel where there is one (coordsAddTile) and the rest through
	// Go. The negative rounds mask into used buffers (MaskEncodedTo).
	const n = 5
	edge := int64(math.MaxInt32/n - 1)
	for _, c := range []struct {
		eb       int64
		ring     int
		weighted bool
	}{{edge, 32, false}, {edge, 32, true}, {edge + 1, 64, false}} {
		for _, sign := range []int64{1, -1} {
			p := testParams("ring-edge", n, 0, 13, math.Ldexp(float64(c.eb)+0.5, -f))
			p.GridBits = f
			if c.weighted {
				p.Weighted, p.MaxWeight = true, 1e9
			}
			h, err := newHarness(t, p)
			if err != nil {
				t.Fatal(err)
			}
			if bits := h.server.r.ringBits; bits != c.ring {
				t.Fatalf("encoded bound %d: ring Z_2^%d, want %d", c.eb, bits, c.ring)
			}
			h.enc = map[string][]int64{}
			h.reuse = sign < 0
			pattern := []int64{1, 1, -1, 1, -1, -1, 1, -1, -1, 1, 1, -1, -1}
			for _, id := range h.ids {
				y := make([]int64, len(pattern))
				for i, s := range pattern {
					y[i] = s * sign * c.eb
				}
				h.enc[id] = y
				h.inputs[id] = make([]float64, len(y))
				for i, v := range y {
					h.inputs[id][i] = math.Ldexp(float64(v), -f)
				}
				if c.weighted {
					h.weights[id] = 1e9
				}
			}
			if !h.run() {
				t.Fatalf("round refused:\n%s", h.out.String())
			}
			want := make([]float64, len(pattern))
			for i, s := range pattern {
				want[i] = math.Ldexp(float64(n*s*sign*c.eb), -f)
			}
			if !slices.Equal(h.result.Sum, want) {
				t.Fatalf("ring %d, bound %d: sum %v, want %v exactly", c.ring, c.eb, h.result.Sum, want)
			}
			if c.weighted && h.result.Weight != n*1e9 {
				t.Fatalf("weight %v, want %v", h.result.Weight, n*1e9)
			}
			if got := len(h.dels); got != n {
				t.Fatalf("%d deliveries", got)
			}
		}
	}
}

// encodeWithDraw encodes x with the 16-bit draw d, through the client's
// encoding loop.
func encodeWithDraw(x, scale float64, d uint16) int64 {
	var w [8]byte
	var dr [roundBytes]byte
	le.PutUint16(dr[:], d)
	encodeTile(w[:], 8, []float64{x}, scale, dr[:])
	return int64(le.Uint64(w[:]))
}

// TestRoundingDecisionIsExact goes through all 2^16 draws of the
// stochastic rounding for a set of fractions, with the tie's 64 extra
// bits fixed on either side of the threshold, and checks the decision
// against the fraction computed in big floats: a draw below the top 16
// bits h of the fraction rounds up, above it rounds down, and a tie rounds
// up iff the extra bits are below ⌊r·2^64⌋. So the probability of
// rounding up is ⌊frac·2^80⌋·2^-80, within 2^-80 of frac: the bound
// docs/secagg.md states.
func TestRoundingDecisionIsExact(t *testing.T) {
	defer func(f func() uint64) { tieDraw = f }(tieDraw)
	for _, c := range []struct {
		x float64
		f int
	}{{0.1, 20}, {1.0 / 3, 40}, {-0.7, 59}, {3 * 0x1p-18, 0}, {-3 * 0x1p-18, 0}, {1 - 0x1p-40, 10}, {0x1p-30 + 0x1p-70, 0}, {0.5, 3}} {
		scale := math.Ldexp(1, c.f)
		v := new(big.Float).SetMantExp(big.NewFloat(c.x), c.f) // exact
		fl, _ := v.Int(nil)
		if v.Sign() < 0 && new(big.Float).SetInt(fl).Cmp(v) != 0 {
			fl.Sub(fl, big.NewInt(1)) // Int truncates; the floor of a negative non-integer is one less
		}
		frac := new(big.Float).Sub(v, new(big.Float).SetInt(fl))
		hb, _ := new(big.Float).SetMantExp(frac, 16).Int(nil)
		h := hb.Int64()
		rest := new(big.Float).Sub(new(big.Float).SetMantExp(frac, 16), new(big.Float).SetInt64(h))
		thr, _ := new(big.Float).SetMantExp(rest, 64).Int(nil)
		low := fl.Int64()
		for _, tieUpWanted := range []bool{true, false} {
			if tieUpWanted && thr.Sign() == 0 {
				continue // the tie never rounds up: probability ⌊r·2^64⌋ = 0
			}
			u := new(big.Int).Set(thr)
			if tieUpWanted {
				u.Sub(u, big.NewInt(1))
			}
			tieDraw = func() uint64 { return u.Uint64() }
			ups := int64(0)
			for d := range 1 << 16 {
				got := encodeWithDraw(c.x, scale, uint16(d))
				want := low
				if int64(d) < h || (int64(d) == h && tieUpWanted) {
					want++
				}
				if got != want {
					t.Fatalf("x=%v f=%d draw %d (h=%d, tie rounds up: %v): encoded %d, want %d", c.x, c.f, d, h, tieUpWanted, got, want)
				}
				ups += got - low
			}
			if !tieUpWanted && ups != h {
				t.Fatalf("x=%v f=%d: %d of 2^16 draws round up, want h = %d", c.x, c.f, ups, h)
			}
		}
		// P(up) = (h + thr·2^-64)·2^-16 is within 2^-80 below frac.
		p := new(big.Float).SetPrec(200).SetInt(thr)
		p.SetMantExp(p, -64)
		p.Add(p, new(big.Float).SetInt64(h))
		p.SetMantExp(p, -16)
		gap := new(big.Float).SetPrec(200).Sub(frac, p)
		if gap.Sign() < 0 || gap.Cmp(new(big.Float).SetMantExp(big.NewFloat(1), -80)) >= 0 {
			t.Fatalf("x=%v f=%d: rounds up with probability %v, fraction %v", c.x, c.f, p, frac)
		}
	}
}

// TestStochasticRoundingTinyFraction: a fraction below 2^-16, which no
// 16-bit draw can exceed, still rounds up at its rate, through the real
// draws and crypto/rand ties: 3·2^-18 rounds up with probability
// 0.75·2^-16, 48 times in 2^22 on average.
func TestStochasticRoundingTinyFraction(t *testing.T) {
	const n = 1 << 22
	const x, p = 3 * 0x1p-18, 0.75 * 0x1p-16
	r, err := newRounder(AESCTR)
	if err != nil {
		t.Fatal(err)
	}
	xs := make([]float64, tileBytes/8)
	for i := range xs {
		xs[i] = x
	}
	out := make([]byte, 8*len(xs))
	draws := make([]byte, roundBytes*len(xs))
	ups := 0
	for range n / len(xs) {
		r.draws(draws)
		encodeTile(out, 8, xs, 1, draws)
		for i := range xs {
			ups += int(le.Uint64(out[8*i:]))
		}
	}
	mean, sd := n*p, math.Sqrt(n*p*(1-p))
	if math.Abs(float64(ups)-mean) > 6*sd {
		t.Fatalf("%v rounded up %d times in %d, want %.0f ± %.0f", x, ups, n, mean, sd)
	}
}

// TestEncodeTileMatchesOneByOne: the client's blocked encoding loop, in
// both widths and for every length around its block of eight, gives what
// encoding each value alone with its draw and laying the integers out
// with putCoords gives.
func TestEncodeTileMatchesOneByOne(t *testing.T) {
	const scale = 0x1p20
	for n := range 27 {
		x := make([]float64, n)
		draws := make([]byte, roundBytes*n)
		for i := range x {
			x[i] = float64((i*37)%19-9) / 7.3
			le.PutUint16(draws[2*i:], uint16(i*40503))
		}
		want := make([]int64, n)
		for i := range x {
			want[i] = encodeWithDraw(x[i], scale, le.Uint16(draws[2*i:]))
		}
		for _, w := range []int{4, 8} {
			got := make([]byte, w*n)
			encodeTile(got, w, x, scale, draws)
			ref := make([]byte, w*n)
			putCoords(ref, w, want)
			if !bytes.Equal(got, ref) {
				t.Fatalf("%d values, width %d: blocked encoding differs from one by one", n, w)
			}
			l := layout{vals: n, width: w}
			for i := range n {
				if c := coordAt(got, l, i); c != want[i] {
					t.Fatalf("%d values, width %d: coordinate %d reads back %d, want %d", n, w, i, c, want[i])
				}
			}
		}
	}
}

// TestTakeDrawsFollowsTheCoordinates: the draws read ahead (a tile's
// bytes a keystream call) are still coordinate i's bytes [2i, 2i+2) of
// the rounding keystream, across calls of both tile sizes, counts that
// do not divide the read-ahead, and a jump that re-seeks.
func TestTakeDrawsFollowsTheCoordinates(t *testing.T) {
	for _, g := range []PRG{AESCTR, ChaCha20} {
		rd := (&rounder{g: g, key: bytes.Repeat([]byte{9}, 32)}).at(0)
		all := make([]byte, 1<<16)
		for o := 0; o < len(all); o += tileBytes {
			rd.draws(all[o : o+tileBytes])
		}
		sc := new(scratch)
		i := 0
		for _, n := range []int{512, 512, 1024, 301, 512, 1024, 1024, 7, -4000, 512, 1024} {
			if n < 0 { // jump ahead: a new segment's start
				i -= n
				continue
			}
			got := sc.takeDraws(rd, i, n)
			if !bytes.Equal(got, all[roundBytes*i:roundBytes*(i+n)]) {
				t.Fatalf("%s: draws of coordinates [%d, %d) are not their keystream bytes", g, i, i+n)
			}
			i += n
		}
	}
}
