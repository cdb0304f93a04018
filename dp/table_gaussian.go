package dp

import (
	"math"
	"math/big"
	"math/bits"
	"math/rand/v2"
	"sync"
)

// The grid's fast exact sampler of N_Z(0, T²): rejection from a
// step-function envelope drawn with an alias table, with a cheap
// floating-point squeeze that decides almost every acceptance and an
// exact big-integer comparison for the rest. Its output has exactly the
// discrete Gaussian's distribution conditioned on |y| < 65·Ymax, at least
// 520·T (the mass beyond is below exp(−135,000)); docs/dp.md gives the
// argument.
//
// Let e(y) = exp(−y²/(2T²)). |y| is proposed in two parts:
//
//   - core blocks b = 0 … n−1 of width w = 2^s (w ≈ T/16 to T/32), covering
//     [0, Ymax) with Ymax = n·w ≥ 8T: |y| = b·w + i with i uniform;
//   - a tail: |y| = Ymax·(1+g) + i, g ~ Geometric(1/2) (g ≥ 64 is
//     rejected), i uniform in [0, Ymax);
//   - and a dummy outcome that is always rejected (it absorbs the table's
//     slack so that its weights sum to a power of two).
//
// The outcome is drawn from an alias table whose integer weights W sum to
// exactly 2^(idxBits+16), so each outcome's probability is an exact
// rational. A sign bit follows (|y| = 0 with a negative sign is
// rejected, so 0 is not counted twice). The proposal's mass at y is then
// W_b/w (core) or W_tail·2^−(g+1)/Ymax (tail), up to one common factor,
// and y is accepted with probability
//
//	A(y) = K·e(y)·w/W_b   or   K·e(y)·Ymax·2^(g+1)/W_tail,
//
// for one constant K (a float64, so an exact dyadic rational). Each W is
// at least K times the largest e·width on its outcome (e decreases in
// |y|, and e falls by more than half from one tail block to the next since
// Ymax ≥ T), so A ≤ 1, and the accepted y has probability proportional to
// q(y)·A(y) ∝ e(y): exactly N_Z(0, T²).
//
// The acceptance test compares a uniform U with A(y). In a core block
// A(y) = c_b·exp(−z) with c_b = K·e(b·w)·w/W_b ∈ (0, 1] and
// z = (2bw·i + i²)/(2T²) ∈ [0, 0.51). c_b is bracketed by certified
// bounds (big-integer arithmetic rounded outward, stored as float64
// rounded outward), and 1 − z + z²/2 − z³/6 ≤ exp(−z) ≤ 1 − z + z²/2 for
// z ≥ 0 (Taylor with remainder). U's first 32 bits x decide when
// (x+1)/2^32 lies below the lower bound or x/2^32 above the upper one,
// each bound widened by the margin gridMargin, far larger than the
// rounding error of the few IEEE-754 operations (each correctly rounded,
// relative error ≤ 2^−53, on values in [0, 1]) that evaluate it. Otherwise
// (probability about z³/6, some 10^−5 on average) U's further bits are
// drawn 64 at a time and compared with bounds on A(y) computed with big
// integers at the same precision until they separate (acceptSlow). The
// tail, whose mass is below e^−32, always takes the exact comparison.

// gridMargin widens the squeeze's float bounds on A ∈ [0, 1]: their
// evaluation error is below 2^−48.
const gridMargin = 0x1p-44

// gridAliasBits is the precision of the alias table's thresholds.
const gridAliasBits = 16

// gaussTable is the immutable part of the sampler for one T, shared by
// goroutines.
type gaussTable struct {
	t       uint64
	s       uint   // block width w = 2^s
	n       int    // core blocks; outcome n is the tail, n+1 the dummy
	ymax    uint64 // n·w
	idxBits uint   // the alias table has 2^idxBits entries
	alias   []aliasEntry
	cLo     []float64 // lower bound of c_b
	cHi     []float64 // upper bound of c_b
	inv2T2  float64   // 1/(2T²), rounded
	k       *big.Rat  // K
	weights []uint64  // W by outcome (n core, tail, dummy)
	twoT2   *big.Int  // 2T²
}

type aliasEntry struct {
	thr   uint32 // own outcome when the 16-bit draw is below thr (≤ 2^16)
	alias uint32
}

// gridCoreSigmas is how many T the core blocks cover.
const gridCoreSigmas = 8

// gridTailBlocks is how many tail blocks of width Ymax the sampler
// proposes: its output is N_Z(0, T²) conditioned on |y| < 65·Ymax
// (Ymax ≥ 8T), whose complement has mass below exp(−520²/2).
const gridTailBlocks = 64

var (
	gaussTablesMu sync.Mutex
	gaussTables   = map[uint64]*gaussTable{}
)

// gaussTableFor returns the (cached) table for T: a run's rounds share
// one T, and building a table costs a few hundred microseconds.
func gaussTableFor(t uint64) *gaussTable {
	gaussTablesMu.Lock()
	defer gaussTablesMu.Unlock()
	if tab, ok := gaussTables[t]; ok {
		return tab
	}
	if len(gaussTables) >= 16 {
		clear(gaussTables)
	}
	tab := buildGaussTable(t, gridCoreSigmas)
	gaussTables[t] = tab
	return tab
}

// buildGaussTable builds the table for N_Z(0, t²), 1 ≤ t ≤ maxGridT, with
// core blocks covering coreSigmas·t (at least 1: the tail's geometric
// envelope needs Ymax ≥ t; tests use a small value to exercise the tail).
func buildGaussTable(t uint64, coreSigmas uint64) *gaussTable {
	if t < 1 || t > maxGridT || coreSigmas < 1 {
		panic("dp: grid gaussian table parameters out of range")
	}
	s := uint(0)
	for t>>(s+1) >= 16 { // w = 2^s ≤ t/16 < 2^(s+1)
		s++
	}
	w := uint64(1) << s
	n := int((coreSigmas*t + w - 1) / w)
	tab := &gaussTable{t: t, s: s, n: n, ymax: uint64(n) * w}
	for 1<<tab.idxBits < n+2 {
		tab.idxBits++
	}
	if tab.idxBits > 9 || s > 22 { // one word holds a whole proposal
		panic("dp: grid gaussian table too large")
	}
	tab.twoT2 = new(big.Int).Mul(new(big.Int).SetUint64(t), new(big.Int).SetUint64(t))
	tab.twoT2.Lsh(tab.twoT2, 1)
	tab.inv2T2 = 1 / (2 * float64(t) * float64(t))

	// Bounds on e(b·w) for b = 0 … n (b = n is Ymax), by the recurrence
	// e((b+1)w) = e(bw)·r^(2b+1), r = exp(−w²/(2T²)), in fixed point with
	// directed rounding (the errors grow like b² units: far below the
	// 2^−53 the floats need at wp = 128).
	const wp = 128
	rlo, rhi := expNegBounds(new(big.Int).SetUint64(w*w), tab.twoT2, wp)
	r2lo, r2hi := mulFloor(rlo, rlo, wp), mulCeil(rhi, rhi, wp)
	elo := make([]*big.Int, n+1)
	ehi := make([]*big.Int, n+1)
	one := new(big.Int).Lsh(big.NewInt(1), wp)
	elo[0], ehi[0] = one, one
	flo, fhi := rlo, rhi // r^(2b+1) for b = 0
	for b := 1; b <= n; b++ {
		elo[b] = mulFloor(elo[b-1], flo, wp)
		ehi[b] = mulCeil(ehi[b-1], fhi, wp)
		flo, fhi = mulFloor(flo, r2lo, wp), mulCeil(fhi, r2hi, wp)
	}

	// K: the envelope's total K·(Σ e(bw)·w + 2e(Ymax)·Ymax) fills all but
	// 2^−10 of the alias table's 2^(idxBits+16) units.
	total := uint64(1) << (tab.idxBits + gridAliasBits)
	var mass float64
	for b := range n {
		mass += ldexpInt(ehi[b], -wp) * float64(w)
	}
	mass += 2 * ldexpInt(ehi[n], -wp) * float64(tab.ymax)
	tab.k = new(big.Rat).SetFloat64(float64(total) * (1 - 1.0/1024) / mass)

	// W_b = ⌈K·e_hi(bw)·w⌉ ≥ K·e(bw)·w, and the tail's ⌈2K·e_hi(Ymax)·Ymax⌉.
	kn, kd := tab.k.Num(), tab.k.Denom()
	ceilW := func(e *big.Int, width uint64) uint64 {
		num := new(big.Int).Mul(e, kn)
		num.Mul(num, new(big.Int).SetUint64(width))
		den := new(big.Int).Lsh(kd, wp)
		return max(quoCeil(num, den).Uint64(), 1)
	}
	tab.weights = make([]uint64, n+2)
	var sum uint64
	for b := range n {
		tab.weights[b] = ceilW(ehi[b], w)
		sum += tab.weights[b]
	}
	tab.weights[n] = ceilW(ehi[n], 2*tab.ymax)
	sum += tab.weights[n]
	if sum > total {
		panic("dp: grid gaussian table overfull")
	}
	tab.weights[n+1] = total - sum

	// c_b bounds, rounded outward to float64.
	tab.cLo = make([]float64, n)
	tab.cHi = make([]float64, n)
	for b := range n {
		den := new(big.Int).Mul(kd, new(big.Int).SetUint64(tab.weights[b]))
		den.Lsh(den, wp)
		numLo := new(big.Int).Mul(elo[b], kn)
		numLo.Mul(numLo, new(big.Int).SetUint64(w))
		numHi := new(big.Int).Mul(ehi[b], kn)
		numHi.Mul(numHi, new(big.Int).SetUint64(w))
		tab.cLo[b] = ratFloatDown(new(big.Rat).SetFrac(numLo, den))
		tab.cHi[b] = ratFloatUp(new(big.Rat).SetFrac(numHi, den))
	}
	tab.alias = buildAlias(tab.weights, tab.idxBits)
	return tab
}

// buildAlias builds an alias table (Walker; Vose's construction) over
// 2^idxBits entries for integer weights summing to 2^(idxBits+16), in
// exact integer arithmetic: entry j keeps its own outcome for thr_j of
// its 2^16 units and gives the rest to alias_j, so outcome o is drawn
// with probability exactly W_o/2^(idxBits+16).
func buildAlias(weights []uint64, idxBits uint) []aliasEntry {
	size := 1 << idxBits
	const unit = 1 << gridAliasBits
	w := make([]uint64, size)
	copy(w, weights)
	tab := make([]aliasEntry, size)
	var small, large []int
	for j, v := range w {
		if v < unit {
			small = append(small, j)
		} else {
			large = append(large, j)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		sj := small[len(small)-1]
		small = small[:len(small)-1]
		lj := large[len(large)-1]
		tab[sj] = aliasEntry{thr: uint32(w[sj]), alias: uint32(lj)}
		w[lj] -= unit - w[sj]
		if w[lj] < unit {
			large = large[:len(large)-1]
			small = append(small, lj)
		}
	}
	// What is left holds exactly one unit's worth each (the sums are exact).
	for _, j := range append(small, large...) {
		if w[j] != unit {
			panic("dp: alias table weights do not sum to the table size")
		}
		tab[j] = aliasEntry{thr: unit, alias: uint32(j)}
	}
	return tab
}

// ldexpInt returns a·2^e as a float64 (approximately; for sizing only).
func ldexpInt(a *big.Int, e int) float64 {
	f, _ := new(big.Float).SetInt(a).Float64()
	return math.Ldexp(f, e)
}

// ratFloatDown and ratFloatUp return a float64 below (above) r.
func ratFloatDown(r *big.Rat) float64 {
	f, _ := r.Float64()
	if new(big.Rat).SetFloat64(f).Cmp(r) > 0 {
		f = math.Nextafter(f, math.Inf(-1))
	}
	return f
}

func ratFloatUp(r *big.Rat) float64 {
	f, _ := r.Float64()
	if new(big.Rat).SetFloat64(f).Cmp(r) < 0 {
		f = math.Nextafter(f, math.Inf(1))
	}
	return f
}

// gridSampler draws N_Z(0, T²) with a table; one per goroutine (it holds
// its own ChaCha8 stream keyed from a Noise, so the hot loop takes no lock).
type gridSampler struct {
	tab   *gaussTable
	src   *rand.ChaCha8
	half  uint64 // 32 unused random bits, when haveH
	haveH bool
}

func newGridSampler(tab *gaussTable, src *rand.ChaCha8) *gridSampler {
	return &gridSampler{tab: tab, src: src}
}

// u32 returns 32 uniform random bits.
func (g *gridSampler) u32() uint64 {
	if g.haveH {
		g.haveH = false
		return g.half
	}
	w := g.src.Uint64()
	g.half, g.haveH = w>>32, true
	return w & 0xffffffff
}

func (g *gridSampler) addTo(v []int64) {
	for i := range v {
		v[i] += g.sample()
	}
}

// sample returns one draw of N_Z(0, T²).
func (g *gridSampler) sample() int64 {
	tab := g.tab
	for {
		// One word per proposal: the alias index (the top idxBits ≤ 9
		// bits), the alias threshold draw (bits 39–54), U's first 16 bits
		// (bits 23–38), the sign (bit 22) and the offset i in the block
		// (the low s ≤ 22 bits).
		a := g.src.Uint64()
		o := int(a >> (64 - tab.idxBits))
		if e := tab.alias[o]; uint32(a>>39)&(1<<gridAliasBits-1) >= e.thr {
			o = int(e.alias)
		}
		if o >= tab.n {
			if o > tab.n { // the dummy outcome
				continue
			}
			if y, ok := g.tail(); ok {
				return y
			}
			continue
		}
		i := a & (1<<tab.s - 1)
		y := uint64(o)<<tab.s + i
		neg := a>>22&1 == 1
		if y == 0 && neg {
			continue
		}
		if g.acceptCore(o, y, i, a>>23&0xffff) {
			if neg {
				return -int64(y)
			}
			return int64(y)
		}
	}
}

// acceptCore decides U < A(y) = c_b·exp(−z) for y = b·w + i, given U's
// first 16 bits x: by the squeeze on 16 bits, then on 48 bits with
// tighter polynomial bounds, then exactly.
func (g *gridSampler) acceptCore(b int, y, i, x uint64) bool {
	tab := g.tab
	z := tab.z(b, i)
	if accept, ok := tab.squeeze(b, z, x, 16, false); ok {
		return accept
	}
	x = x<<32 | g.u32()
	if accept, ok := tab.squeeze(b, z, x, 48, true); ok {
		return accept
	}
	return g.acceptSlow(x, 48, y, tab.k, tab.blockWidth(), tab.weights[b], 0)
}

// z returns (2bw·i + i²)/(2T²), rounded: 2bw·i + i² < 2·Ymax·w + w² ≤
// 2^53 for T ≤ 2^26 is exact in float64, and the product with the
// rounded 1/(2T²) is within 2^−52 of z relatively.
func (tab *gaussTable) z(b int, i uint64) float64 {
	return float64(int64(2*(uint64(b)<<tab.s)*i+i*i)) * tab.inv2T2
}

// squeeze decides U < A = c_b·exp(−z) from U's first plen ≤ 48 bits x
// when the certified float bounds on A allow it (ok), and reports
// ok = false otherwise. The bounds are c_b's, times the Taylor
// polynomials of exp(−z) of degree 3 and 2 (or 5 and 4 when fine), which
// bound it from below and above for z ≥ 0, widened by gridMargin.
func (tab *gaussTable) squeeze(b int, z float64, x uint64, plen int, fine bool) (accept, ok bool) {
	scale := float64(int64(1) << plen) // exact: a power of two
	var pl float64
	if fine {
		pl = 1 - z*(1-z*0.5*(1-z*(1.0/3)*(1-z*0.25*(1-z*0.2))))
	} else {
		pl = 1 - z*(1-z*0.5*(1-z*(1.0/3)))
	}
	if float64(int64(x+1)) <= (tab.cLo[b]*pl-gridMargin)*scale { // x < 2^48: exact
		return true, true
	}
	var ph float64
	if fine {
		ph = 1 - z*(1-z*0.5*(1-z*(1.0/3)*(1-z*0.25)))
	} else {
		ph = 1 - z*(1-z*0.5)
	}
	if float64(int64(x)) >= (tab.cHi[b]*ph+gridMargin)*scale {
		return false, true
	}
	return false, false
}

func (t *gaussTable) blockWidth() uint64 { return 1 << t.s }

// tail proposes |y| = Ymax·(1+g) + i and decides its acceptance exactly.
// ok is false when the proposal is rejected.
func (g *gridSampler) tail() (int64, bool) {
	tab := g.tab
	var geo uint64
	for {
		w := g.src.Uint64()
		if w != 0 {
			geo += uint64(bits.TrailingZeros64(w))
			break
		}
		geo += 64
	}
	if geo >= gridTailBlocks {
		// Beyond the range the sampler restricts itself to.
		return 0, false
	}
	// ymax·(geo+1) + i < 65·Ymax ≤ 2^38: no overflow.
	y := tab.ymax*(geo+1) + g.uniform64(tab.ymax)
	neg := g.src.Uint64()&1 == 1
	if !g.acceptSlow(0, 0, y, g.tab.k, tab.ymax, tab.weights[tab.n], geo+1) {
		return 0, false
	}
	if neg {
		return -int64(y), true
	}
	return int64(y), true
}

// uniform64 returns a uniform integer in [0, n), n > 0, exactly (Lemire's
// multiply-and-reject).
func (g *gridSampler) uniform64(n uint64) uint64 {
	hi, lo := bits.Mul64(g.src.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(g.src.Uint64(), n)
		}
	}
	return hi
}

// acceptSlow decides U < A = K·e(y)·width·2^pow2/W exactly, given U's
// first plen bits x: U's further bits are drawn 64 at a time, and A is
// bracketed with big integers at the precision of U's known prefix, until
// the prefix's interval [x, x+1)/2^plen lies wholly below or above A.
func (g *gridSampler) acceptSlow(x uint64, plen uint, y uint64, k *big.Rat, width, weight uint64, pow2 uint64) bool {
	tab := g.tab
	qn := new(big.Int).SetUint64(y)
	qn.Mul(qn, qn)
	// A = rn/rd · exp(−qn/2T²).
	rn := new(big.Int).Mul(k.Num(), new(big.Int).SetUint64(width))
	rn.Lsh(rn, uint(pow2))
	rd := new(big.Int).Mul(k.Denom(), new(big.Int).SetUint64(weight))
	p := new(big.Int).SetUint64(x)
	for {
		p.Lsh(p, 64)
		p.Or(p, new(big.Int).SetUint64(g.src.Uint64()))
		plen += 64
		lo, hi := aBounds(qn, tab.twoT2, rn, rd, plen)
		if new(big.Int).Add(p, big.NewInt(1)).Cmp(lo) <= 0 {
			return true
		}
		if p.Cmp(hi) >= 0 {
			return false
		}
	}
}

// aBounds returns lo ≤ 2^prec·(rn/rd)·exp(−qn/qd) ≤ hi.
func aBounds(qn, qd, rn, rd *big.Int, prec uint) (lo, hi *big.Int) {
	const guard = 64
	elo, ehi := expNegBounds(qn, qd, prec+guard)
	lo = quoFloor(new(big.Int).Mul(elo, rn), new(big.Int).Lsh(rd, guard))
	hi = quoCeil(new(big.Int).Mul(ehi, rn), new(big.Int).Lsh(rd, guard))
	return lo, hi
}

// addGridGaussian adds independent N_Z(0, t²) draws to v with the table
// sampler on the stream src.
func addGridGaussian(v []int64, t uint64, src *rand.ChaCha8) {
	newGridSampler(gaussTableFor(t), src).addTo(v)
}
