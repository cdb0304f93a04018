// Package repmath holds the elementary functions of the replayable tier:
// Exp, Log, Log1p and Tanh that return the same bits on every architecture.
//
// The standard library's versions do not: math.Exp and math.Log are
// assembly on amd64 (and Exp on arm64), and the pure-Go fallbacks are
// compiled with fused multiply-adds on arm64, ppc64 and s390x (the Go spec
// allows fusing x*y + z unless an explicit conversion rounds the product).
// Built for linux/arm64, math.Exp, Log, Log1p and Tanh each differ from
// the amd64 results by an ulp on some inputs, enough for two honest
// replicas of a training shard to disagree. The functions here are the
// standard library's pure-Go algorithms (FreeBSD's msun, via Go's math
// package) with every product rounded by float64(), so no compiler may
// fuse them; their error bounds are the same (under 1 ulp).
package repmath

import "math"

const (
	ln2Hi = 6.93147180369123816490e-01
	ln2Lo = 1.90821492927058770002e-10
)

// Exp returns e**x.
func Exp(x float64) float64 {
	const (
		log2e     = 1.44269504088896338700e+00
		overflow  = 7.09782712893383973096e+02
		underflow = -7.45133219101941108420e+02
		nearZero  = 1.0 / (1 << 28)
	)
	switch {
	case math.IsNaN(x):
		return x
	case x > overflow:
		return math.Inf(1)
	case x < underflow:
		return 0
	case -nearZero < x && x < nearZero:
		return 1 + x
	}
	var k int
	switch {
	case x < 0:
		k = int(float64(log2e*x) - 0.5)
	case x > 0:
		k = int(float64(log2e*x) + 0.5)
	}
	hi := x - float64(float64(k)*ln2Hi)
	lo := float64(float64(k) * ln2Lo)
	return expmulti(hi, lo, k)
}

func expmulti(hi, lo float64, k int) float64 {
	const (
		p1 = 1.66666666666666657415e-01
		p2 = -2.77777777770155933842e-03
		p3 = 6.61375632143793436117e-05
		p4 = -1.65339022054652515390e-06
		p5 = 4.13813679705723846039e-08
	)
	r := hi - lo
	t := float64(r * r)
	poly := p4 + float64(t*p5)
	poly = p3 + float64(t*poly)
	poly = p2 + float64(t*poly)
	poly = p1 + float64(t*poly)
	c := r - float64(t*poly)
	y := 1 - ((lo - float64(r*c)/(2-c)) - hi)
	return math.Ldexp(y, k)
}

// The polynomial of log's and log1p's reduced argument (Go's math, from
// FreeBSD's e_log.c): one set of coefficients, two evaluation orders (each
// as Go's own, so the results are its bits without fused operations).
const (
	l1 = 6.666666666666735130e-01
	l2 = 3.999999999940941908e-01
	l3 = 2.857142874366239149e-01
	l4 = 2.222219843214978396e-01
	l5 = 1.818357216161805012e-01
	l6 = 1.531383769920937332e-01
	l7 = 1.479819860511658591e-01
)

// Log returns the natural logarithm of x.
func Log(x float64) float64 {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 1):
		return x
	case x < 0:
		return math.NaN()
	case x == 0:
		return math.Inf(-1)
	}
	f1, ki := math.Frexp(x)
	if f1 < math.Sqrt2/2 {
		f1 *= 2
		ki--
	}
	f := f1 - 1
	k := float64(ki)
	s := f / (2 + f)
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := l5 + float64(s4*l7)
	t1 = l3 + float64(s4*t1)
	t1 = l1 + float64(s4*t1)
	t1 = float64(s2 * t1)
	t2 := l4 + float64(s4*l6)
	t2 = l2 + float64(s4*t2)
	t2 = float64(s4 * t2)
	r := t1 + t2
	hfsq := float64(float64(0.5*f) * f)
	return float64(k*ln2Hi) - ((hfsq - (float64(s*(hfsq+r)) + float64(k*ln2Lo))) - f)
}

// Log1p returns the natural logarithm of 1+x, accurate also when x is near
// zero.
func Log1p(x float64) float64 {
	const (
		sqrt2M1     = 4.142135623730950488017e-01
		sqrt2HalfM1 = -2.928932188134524755992e-01
		small       = 1.0 / (1 << 29)
		tiny        = 1.0 / (1 << 54)
		two53       = 1 << 53
	)
	switch {
	case x < -1 || math.IsNaN(x):
		return math.NaN()
	case x == -1:
		return math.Inf(-1)
	case math.IsInf(x, 1):
		return math.Inf(1)
	}
	absx := math.Abs(x)
	var f float64
	var iu uint64
	k := 1
	if absx < sqrt2M1 {
		if absx < small {
			if absx < tiny {
				return x
			}
			return x - float64(float64(x*x)*0.5)
		}
		if x > sqrt2HalfM1 {
			k = 0
			f = x
			iu = 1
		}
	}
	var c float64
	if k != 0 {
		var u float64
		if absx < two53 {
			u = 1.0 + x
			iu = math.Float64bits(u)
			k = int((iu >> 52) - 1023)
			if k > 0 {
				c = 1.0 - (u - x)
			} else {
				c = x - (u - 1.0)
			}
			c /= u
		} else {
			u = x
			iu = math.Float64bits(u)
			k = int((iu >> 52) - 1023)
			c = 0
		}
		iu &= 0x000fffffffffffff
		if iu < 0x0006a09e667f3bcd {
			u = math.Float64frombits(iu | 0x3ff0000000000000)
		} else {
			k++
			u = math.Float64frombits(iu | 0x3fe0000000000000)
			iu = (0x0010000000000000 - iu) >> 2
		}
		f = u - 1.0
	}
	hfsq := float64(float64(0.5*f) * f)
	fk := float64(k)
	if iu == 0 {
		if f == 0 {
			if k == 0 {
				return 0
			}
			c += float64(fk * ln2Lo)
			return float64(fk*ln2Hi) + c
		}
		r := float64(hfsq * (1.0 - float64(0.66666666666666666*f)))
		if k == 0 {
			return f - r
		}
		return float64(fk*ln2Hi) - ((r - (float64(fk*ln2Lo) + c)) - f)
	}
	s := f / (2.0 + f)
	z := float64(s * s)
	r := l6 + float64(z*l7)
	r = l5 + float64(z*r)
	r = l4 + float64(z*r)
	r = l3 + float64(z*r)
	r = l2 + float64(z*r)
	r = l1 + float64(z*r)
	r = float64(z * r)
	if k == 0 {
		return f - (hfsq - float64(s*(hfsq+r)))
	}
	return float64(fk*ln2Hi) - ((hfsq - (float64(s*(hfsq+r)) + (float64(fk*ln2Lo) + c))) - f)
}

// Tanh returns the hyperbolic tangent of x.
func Tanh(x float64) float64 {
	const maxLog = 8.8029691931113054295988e+01 // log(2**127)
	z := math.Abs(x)
	switch {
	case z > 0.5*maxLog:
		if x < 0 {
			return -1
		}
		return 1
	case z >= 0.625:
		s := Exp(2 * z)
		z = 1 - 2/(s+1)
		if x < 0 {
			z = -z
		}
	default:
		if x == 0 {
			return x
		}
		const (
			p0, p1, p2 = -9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3
			q0, q1, q2 = 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3
		)
		s := float64(x * x)
		num := float64(float64(float64(p0*s)+p1)*s) + p2
		den := float64(float64(s+q0)*s) + q1
		den = float64(den*s) + q2
		z = x + float64(float64(float64(x*s)*num)/den)
	}
	return z
}
