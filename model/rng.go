package model

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// newRand returns a deterministic generator for one purpose. Streams for
// different purposes (initialisation, shuffling, splitting) are independent
// even under the same seed, because the purpose is hashed into the key.
func newRand(purpose string, seed uint64) *rand.Rand {
	h := sha256.New()
	h.Write([]byte("scellis/model/"))
	h.Write([]byte(purpose))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write([]byte{0})
	h.Write(b[:])
	var key [32]byte
	copy(key[:], h.Sum(nil))
	return rand.New(rand.NewChaCha8(key))
}

// shuffle permutes p in place with a Fisher–Yates shuffle driven only by
// r.Uint64 (not rand.Rand.Shuffle, whose algorithm the standard library may
// change), so permutations stay stable across Go releases.
func shuffle(r *rand.Rand, p []int) {
	for i := len(p) - 1; i > 0; i-- {
		j := int(uniformBelow(r, uint64(i+1)))
		p[i], p[j] = p[j], p[i]
	}
}

// uniformBelow returns a uniform integer in [0, n) by rejection (Lemire).
func uniformBelow(r *rand.Rand, n uint64) uint64 {
	for {
		v := r.Uint64()
		hi, lo := bits.Mul64(v, n)
		if lo >= n || lo >= -n%n {
			return hi
		}
	}
}
