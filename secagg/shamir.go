package secagg

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
)

// Shamir secret sharing over GF(2^8), byte by byte (as HashiCorp Vault's
// shamir package does): each byte of the secret is the constant term of its
// own random polynomial of degree t-1, and a share is the vector of those
// polynomials evaluated at the holder's non-zero x coordinate. Any t shares
// give the secret back by Lagrange interpolation at zero; t-1 shares are
// uniformly distributed whatever the secret.
//
// The field is GF(2^8) with the AES polynomial x^8+x^4+x^3+x+1 (0x11b).
// Multiplication and inversion run in constant time: no tables indexed by
// secret bytes and no branches on them.

// gfMul multiplies in GF(2^8) without secret-dependent branches or lookups.
func gfMul(a, b byte) byte {
	var p byte
	for range 8 {
		p ^= -(b & 1) & a
		hi := a >> 7
		a = a<<1 ^ (-hi & 0x1b)
		b >>= 1
	}
	return p
}

// gfInv returns a^254 = a^-1 for a != 0 and 0 for a == 0, by a fixed
// square-and-multiply chain.
func gfInv(a byte) byte {
	// 254 = 0b11111110: a^2, a^4, …, a^128 multiplied together.
	sq := gfMul(a, a) // a^2
	r := sq
	for range 6 {
		sq = gfMul(sq, sq) // a^4 … a^128
		r = gfMul(r, sq)
	}
	return r
}

// maxShares is the largest number of holders: x coordinates are the
// non-zero field elements.
const maxShares = 255

var (
	errShamirParams = errors.New("secagg: invalid Shamir parameters")
	errShamirShares = errors.New("secagg: invalid Shamir shares")
)

// shamirSplit shares secret t-of-len(xs): share i is for the holder at x
// coordinate xs[i] (distinct and non-zero). Coefficients come from rnd,
// which must be a cryptographic source (crypto/rand.Reader in production).
func shamirSplit(rnd io.Reader, secret []byte, t int, xs []byte) ([][]byte, error) {
	if t < 1 || t > len(xs) || len(xs) > maxShares || len(secret) == 0 {
		return nil, fmt.Errorf("%w: t=%d of %d holders", errShamirParams, t, len(xs))
	}
	if err := checkXs(xs); err != nil {
		return nil, err
	}
	// coeffs[k*len(secret)+j] is coefficient k+1 of the polynomial of byte j.
	coeffs := make([]byte, (t-1)*len(secret))
	if _, err := io.ReadFull(rnd, coeffs); err != nil {
		return nil, fmt.Errorf("secagg: reading randomness: %w", err)
	}
	defer clear(coeffs)
	shares := make([][]byte, len(xs))
	for i, x := range xs {
		s := make([]byte, len(secret))
		for j := range secret {
			// Horner: ((c_{t-1} x + c_{t-2}) x + … + c_1) x + secret.
			var y byte
			for k := t - 2; k >= 0; k-- {
				y = gfMul(y, x) ^ coeffs[k*len(secret)+j]
			}
			s[j] = gfMul(y, x) ^ secret[j]
		}
		shares[i] = s
	}
	return shares, nil
}

func checkXs(xs []byte) error {
	var seen [256]bool
	for _, x := range xs {
		if x == 0 || seen[x] {
			return fmt.Errorf("%w: x coordinate %d zero or repeated", errShamirShares, x)
		}
		seen[x] = true
	}
	return nil
}

// lagrangeAtZero returns the coefficients l_i with f(0) = Σ l_i·f(xs[i]) for
// every polynomial f of degree below len(xs). In characteristic 2,
// l_i = Π_{m≠i} x_m / (x_m + x_i).
func lagrangeAtZero(xs []byte) ([]byte, error) {
	if len(xs) == 0 || len(xs) > maxShares {
		return nil, errShamirShares
	}
	if err := checkXs(xs); err != nil {
		return nil, err
	}
	ls := make([]byte, len(xs))
	for i, xi := range xs {
		num, den := byte(1), byte(1)
		for m, xm := range xs {
			if m == i {
				continue
			}
			num = gfMul(num, xm)
			den = gfMul(den, xm^xi)
		}
		ls[i] = gfMul(num, gfInv(den))
	}
	return ls, nil
}

// combineWith reconstructs a secret from shares ys taken at the x
// coordinates whose Lagrange coefficients are ls (see lagrangeAtZero). With
// more shares than the threshold the result is still the secret, provided
// every share is genuine; callers that can check the secret (a commitment, a
// public key) should.
func combineWith(ls []byte, ys [][]byte) ([]byte, error) {
	if len(ys) != len(ls) || len(ys) == 0 {
		return nil, errShamirShares
	}
	n := len(ys[0])
	for _, y := range ys {
		if len(y) != n {
			return nil, fmt.Errorf("%w: shares of different lengths", errShamirShares)
		}
	}
	secret := make([]byte, n)
	for i, y := range ys {
		for j := range n {
			secret[j] ^= gfMul(ls[i], y[j])
		}
	}
	return secret, nil
}

// shamirCombine reconstructs a secret from shares ys held at xs.
func shamirCombine(xs []byte, ys [][]byte) ([]byte, error) {
	ls, err := lagrangeAtZero(xs)
	if err != nil {
		return nil, err
	}
	return combineWith(ls, ys)
}

// equalSecret compares two secrets in constant time.
func equalSecret(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
