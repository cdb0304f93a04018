package secagg

import (
	"bytes"
	"crypto/rand"
	mrand "math/rand/v2"
	"testing"
)

// slowMul is the schoolbook reference: carry-less multiply, then reduce
// modulo x^8+x^4+x^3+x+1.
func slowMul(a, b byte) byte {
	var p uint16
	for i := range 8 {
		if b>>i&1 == 1 {
			p ^= uint16(a) << i
		}
	}
	for i := 15; i >= 8; i-- {
		if p>>i&1 == 1 {
			p ^= 0x11b << (i - 8)
		}
	}
	return byte(p)
}

func TestGF256MulMatchesReference(t *testing.T) {
	for a := range 256 {
		for b := range 256 {
			if got, want := gfMul(byte(a), byte(b)), slowMul(byte(a), byte(b)); got != want {
				t.Fatalf("gfMul(%#x, %#x) = %#x, want %#x", a, b, got, want)
			}
		}
	}
	// Known value from FIPS-197 §4.2: {57}·{83} = {c1}.
	if gfMul(0x57, 0x83) != 0xc1 {
		t.Fatal("{57}·{83} != {c1}")
	}
}

func TestGF256Inverse(t *testing.T) {
	if gfInv(0) != 0 {
		t.Fatal("inv(0) != 0")
	}
	for a := 1; a < 256; a++ {
		if p := gfMul(byte(a), gfInv(byte(a))); p != 1 {
			t.Fatalf("%#x · inv(%#x) = %#x", a, a, p)
		}
	}
}

func TestGF256Distributive(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 100000 {
		a, b, c := byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())
		if gfMul(a, b^c) != gfMul(a, b)^gfMul(a, c) {
			t.Fatalf("a(b+c) != ab+ac for %#x %#x %#x", a, b, c)
		}
		if gfMul(gfMul(a, b), c) != gfMul(a, gfMul(b, c)) {
			t.Fatalf("(ab)c != a(bc) for %#x %#x %#x", a, b, c)
		}
	}
}

func xsFor(n int) []byte {
	xs := make([]byte, n)
	for i := range xs {
		xs[i] = byte(i + 1)
	}
	return xs
}

func TestShamirAnyTSharesReconstruct(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(3, 4))
	for range 300 {
		n := 1 + rng.IntN(30)
		thr := 1 + rng.IntN(n)
		secret := make([]byte, 32)
		rand.Read(secret)
		// Random distinct x coordinates, not only 1…n.
		perm := rng.Perm(255)
		xs := make([]byte, n)
		for i := range xs {
			xs[i] = byte(perm[i] + 1)
		}
		shares, err := shamirSplit(rand.Reader, secret, thr, xs)
		if err != nil {
			t.Fatal(err)
		}
		// A random subset of size k ≥ t reconstructs.
		k := thr + rng.IntN(n-thr+1)
		idx := rng.Perm(n)[:k]
		sx, sy := make([]byte, k), make([][]byte, k)
		for i, j := range idx {
			sx[i], sy[i] = xs[j], shares[j]
		}
		got, err := shamirCombine(sx, sy)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, secret) {
			t.Fatalf("n=%d t=%d: %d shares reconstruct the wrong secret", n, thr, k)
		}
		// t-1 shares do not (except with probability 2^-256).
		if thr > 1 {
			got, err := shamirCombine(sx[:thr-1], sy[:thr-1])
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(got, secret) {
				t.Fatalf("n=%d t=%d: t-1 shares reconstruct the secret", n, thr)
			}
		}
		// A corrupted share changes the result.
		sy[0] = bytes.Clone(sy[0])
		sy[0][5] ^= 0x80
		if got, _ := shamirCombine(sx, sy); bytes.Equal(got, secret) {
			t.Fatal("corrupted share still reconstructs the secret")
		}
	}
}

func TestShamirAllHolders(t *testing.T) {
	secret := bytes.Repeat([]byte{0xa5}, 32)
	shares, err := shamirSplit(rand.Reader, secret, maxShares, xsFor(maxShares))
	if err != nil {
		t.Fatal(err)
	}
	got, err := shamirCombine(xsFor(maxShares), shares)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("255-of-255 failed: %v", err)
	}
}

// fixedReader is a deterministic "randomness" source that enumerates
// coefficients in the secrecy test.
type fixedReader []byte

func (f fixedReader) Read(p []byte) (int, error) { return copy(p, f), nil }

// TestShamirSharesHideTheSecret checks perfect secrecy exhaustively on one
// byte: for t = 2 a single share, and for t = 3 any two shares, take every
// value equally often as the coefficients range over the field, whatever
// the secret.
func TestShamirSharesHideTheSecret(t *testing.T) {
	for _, secret := range []byte{0x00, 0x01, 0xa5, 0xff} {
		var single [256]int
		for c1 := range 256 {
			sh, err := shamirSplit(fixedReader{byte(c1)}, []byte{secret}, 2, []byte{7, 200})
			if err != nil {
				t.Fatal(err)
			}
			single[sh[0][0]]++
		}
		for v, c := range single {
			if c != 1 {
				t.Fatalf("secret %#x, t=2: share value %#x occurs %d times", secret, v, c)
			}
		}
		pairs := make(map[[2]byte]int, 65536)
		for c := range 65536 {
			sh, err := shamirSplit(fixedReader{byte(c), byte(c >> 8)}, []byte{secret}, 3, []byte{3, 99, 250})
			if err != nil {
				t.Fatal(err)
			}
			pairs[[2]byte{sh[0][0], sh[2][0]}]++
		}
		if len(pairs) != 65536 {
			t.Fatalf("secret %#x, t=3: two shares take %d of 65536 value pairs", secret, len(pairs))
		}
	}
}

func TestShamirRefusesBadInput(t *testing.T) {
	secret := make([]byte, 32)
	for _, c := range []struct {
		t  int
		xs []byte
	}{
		{0, xsFor(3)}, {4, xsFor(3)}, {2, []byte{1, 1, 2}}, {2, []byte{0, 1, 2}}, {2, nil},
	} {
		if _, err := shamirSplit(rand.Reader, secret, c.t, c.xs); err == nil {
			t.Errorf("split t=%d xs=%v accepted", c.t, c.xs)
		}
	}
	if _, err := shamirSplit(rand.Reader, secret, 2, make([]byte, 256)); err == nil {
		t.Error("split to 256 holders accepted")
	}
	if _, err := shamirSplit(rand.Reader, nil, 1, xsFor(2)); err == nil {
		t.Error("split of an empty secret accepted")
	}
	if _, err := shamirCombine([]byte{1, 1}, [][]byte{secret, secret}); err == nil {
		t.Error("combine with a repeated x accepted")
	}
	if _, err := shamirCombine([]byte{1, 2}, [][]byte{secret, secret[:31]}); err == nil {
		t.Error("combine of shares of different lengths accepted")
	}
	if _, err := shamirCombine(nil, nil); err == nil {
		t.Error("combine of no shares accepted")
	}
}
