package dp

import (
	"math/big"
	"sync"
)

// Certified bounds on exp(−q) for a non-negative rational q, in big-integer
// fixed point: the grid sampler's table is built from them, and its rare
// undecided comparisons are settled with them to any precision. Every
// rounding is directed (down for a lower bound, up for an upper one), so
// the bounds hold exactly, not approximately.

// expNegBounds returns integers lo ≤ 2^prec·exp(−qn/qd) ≤ hi, for qn ≥ 0,
// qd > 0, with hi − lo at most a few units: the guard bits absorb the
// roundings of the series and of the power.
func expNegBounds(qn, qd *big.Int, prec uint) (lo, hi *big.Int) {
	k, f := new(big.Int).QuoRem(qn, qd, new(big.Int))
	// exp(−k) < 2^(−1.44k): once 1.44k exceeds prec + 2 the value is below
	// a quarter of a unit, and [0, 1] bounds it.
	if k.Cmp(big.NewInt(int64(prec)+2)) > 0 {
		return new(big.Int), big.NewInt(1)
	}
	kk := k.Uint64()
	wp := prec + 2*uint(big.NewInt(int64(kk)).BitLen()) + 24
	lo, hi = expNegSeries(f, qd, wp)
	if kk > 0 {
		e1lo, e1hi := expNegOne(wp)
		plo, phi := powFixed(e1lo, e1hi, kk, wp)
		lo = mulFloor(lo, plo, wp)
		hi = mulCeil(hi, phi, wp)
	}
	return shrFloor(lo, wp-prec), shrCeil(hi, wp-prec)
}

// expNegSeries bounds 2^wp·exp(−fn/fd) for 0 ≤ fn ≤ fd by the Taylor
// series Σ (−f)^m/m!: its terms do not increase for f ≤ 1, so a partial
// sum ending on a negative term is below the limit and one ending on a
// positive term above it. Each term is carried as a pair rounded down and
// up; the lower sum takes the low value of positive terms and the high of
// negative ones, the upper sum the reverse.
func expNegSeries(fn, fd *big.Int, wp uint) (lo, hi *big.Int) {
	one := new(big.Int).Lsh(big.NewInt(1), wp)
	if fn.Sign() == 0 {
		return one, new(big.Int).Set(one)
	}
	tl, th := new(big.Int).Set(one), new(big.Int).Set(one)
	sl, sh := new(big.Int).Set(one), new(big.Int).Set(one)
	var haveLo, haveHi bool
	den, r := new(big.Int), new(big.Int)
	for m := int64(1); ; m++ {
		den.Mul(fd, big.NewInt(m))
		tl.Mul(tl, fn)
		tl.Quo(tl, den) // floor: both non-negative
		th.Mul(th, fn)
		th.QuoRem(th, den, r)
		if r.Sign() != 0 {
			th.Add(th, big.NewInt(1))
		}
		if m%2 == 1 {
			sl.Sub(sl, th)
			sh.Sub(sh, tl)
			if th.Cmp(big.NewInt(1)) <= 0 {
				lo, haveLo = new(big.Int).Set(sl), true
			}
		} else {
			sl.Add(sl, tl)
			sh.Add(sh, th)
			if th.Cmp(big.NewInt(1)) <= 0 {
				hi, haveHi = new(big.Int).Set(sh), true
			}
		}
		if haveLo && haveHi {
			if lo.Sign() < 0 {
				lo.SetInt64(0)
			}
			return lo, hi
		}
	}
}

// powFixed bounds x^k for x ∈ [lo, hi]/2^wp (0 ≤ lo ≤ hi ≤ 2^wp), k ≥ 1,
// by square-and-multiply with directed rounding.
func powFixed(lo, hi *big.Int, k uint64, wp uint) (plo, phi *big.Int) {
	one := new(big.Int).Lsh(big.NewInt(1), wp)
	plo, phi = new(big.Int).Set(one), new(big.Int).Set(one)
	blo, bhi := new(big.Int).Set(lo), new(big.Int).Set(hi)
	for ; k > 0; k >>= 1 {
		if k&1 == 1 {
			plo = mulFloor(plo, blo, wp)
			phi = mulCeil(phi, bhi, wp)
		}
		if k > 1 {
			blo = mulFloor(blo, blo, wp)
			bhi = mulCeil(bhi, bhi, wp)
		}
	}
	return plo, phi
}

// mulFloor returns ⌊a·b/2^wp⌋, mulCeil ⌈a·b/2^wp⌉ (a, b ≥ 0).
func mulFloor(a, b *big.Int, wp uint) *big.Int {
	return shrFloor(new(big.Int).Mul(a, b), wp)
}

func mulCeil(a, b *big.Int, wp uint) *big.Int {
	return shrCeil(new(big.Int).Mul(a, b), wp)
}

// shrFloor returns ⌊a/2^s⌋, shrCeil ⌈a/2^s⌉ for a ≥ 0.
func shrFloor(a *big.Int, s uint) *big.Int { return new(big.Int).Rsh(a, s) }

func shrCeil(a *big.Int, s uint) *big.Int {
	q := new(big.Int).Rsh(a, s)
	if new(big.Int).Lsh(q, s).Cmp(a) != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// quoFloor returns ⌊a/b⌋, quoCeil ⌈a/b⌉ for a ≥ 0, b > 0.
func quoFloor(a, b *big.Int) *big.Int { return new(big.Int).Quo(a, b) }

func quoCeil(a, b *big.Int) *big.Int {
	q, r := new(big.Int).QuoRem(a, b, new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// expNegOne returns expNegSeries(1, 1, wp), cached: the exact comparisons
// need e^−1 at a handful of precisions. The bounds are shared read-only.
func expNegOne(wp uint) (lo, hi *big.Int) {
	expNegOneMu.Lock()
	defer expNegOneMu.Unlock()
	if b, ok := expNegOneCache[wp]; ok {
		return b[0], b[1]
	}
	lo, hi = expNegSeries(big.NewInt(1), big.NewInt(1), wp)
	if len(expNegOneCache) >= 64 {
		clear(expNegOneCache)
	}
	expNegOneCache[wp] = [2]*big.Int{lo, hi}
	return lo, hi
}

var (
	expNegOneMu    sync.Mutex
	expNegOneCache = map[uint][2]*big.Int{}
)
