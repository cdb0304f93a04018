package datagen

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// newRand returns a deterministic generator for one named stream under seed;
// distinct names give independent streams.
func newRand(seed uint64, stream string) *rand.Rand {
	h := sha256.New()
	h.Write([]byte("scellis/datagen/"))
	h.Write([]byte(stream))
	h.Write([]byte{0})
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	var key [32]byte
	copy(key[:], h.Sum(nil))
	return rand.New(rand.NewChaCha8(key))
}

func normal(r *rand.Rand, mean, sd float64) float64 { return mean + sd*r.NormFloat64() }

func bernoulli(r *rand.Rand, p float64) float64 {
	if r.Float64() < p {
		return 1
	}
	return 0
}

// poisson draws a Poisson(lambda) count by inversion (lambda is small here).
func poisson(r *rand.Rand, lambda float64) float64 {
	l, k, p := math.Exp(-lambda), 0.0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

// round rounds v to the given number of decimals; the result is the float64
// nearest the decimal value, so it prints back as that decimal.
func round(v float64, decimals int) float64 {
	s := math.Pow10(decimals)
	return math.Round(v*s) / s
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }
