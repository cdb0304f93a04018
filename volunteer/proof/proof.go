// Package proof holds what a browser volunteer and the join endpoint
// (package volunteer) must compute alike: the proof of work over a
// server challenge and the message a volunteer's key signs to join. It
// imports nothing that reaches the network, so the WebAssembly worker
// (cmd/scellis-wasm) links it and the tab never does this crypto in
// hand-written JavaScript.
//
// Invariant: Check(c, k, Solve(c, k, bits), bits) holds, and a proof is
// bound to one challenge and one key.
package proof

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"strconv"
)

// PurposeJoin is the Ed25519ctx context of a volunteer's join signature:
// the value of identity.PurposeVolunteerJoin, declared there with every
// other purpose (identity.TestPurposesDistinct holds them equal), so a
// join signature is valid for no other purpose.
const PurposeJoin = "scellis/volunteer-join/v1"

// MaxBits bounds a difficulty: 2^32 hashes is hours in a tab.
const MaxBits = 32

// digest is SHA-256 of the domain, challenge, key and nonce, each
// length-prefixed so no two inputs share a digest.
func digest(challenge, key string, nonce uint64) [32]byte {
	h := sha256.New()
	for _, s := range []string{"scellis/volunteer-pow/v1", challenge, key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], nonce)
	h.Write(n[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// zeros counts d's leading zero bits.
func zeros(d [32]byte) int {
	n := 0
	for _, b := range d {
		if b != 0 {
			return n + bits.LeadingZeros8(b)
		}
		n += 8
	}
	return n
}

// Check reports whether nonce proves work of difficulty bits for
// challenge and key: the digest starts with at least bits zero bits.
func Check(challenge, key string, nonce uint64, difficulty int) bool {
	if difficulty < 0 || difficulty > MaxBits {
		return false
	}
	return zeros(digest(challenge, key, nonce)) >= difficulty
}

// Solve finds the smallest nonce that Check accepts (2^bits tries on
// average).
func Solve(challenge, key string, difficulty int) uint64 {
	for n := uint64(0); ; n++ {
		if Check(challenge, key, n, difficulty) {
			return n
		}
	}
}

// JoinMessage is what a volunteer's key signs to join: proof that the
// tab holds the private key of the public key it registers, for this
// challenge only.
func JoinMessage(challenge, key string) []byte {
	return []byte("scellis volunteer join\nchallenge " + challenge + "\nkey " + key + "\nlen " + strconv.Itoa(len(challenge)+len(key)))
}

// VerifyJoin reports whether sig is pub's signature of JoinMessage.
func VerifyJoin(pub ed25519.PublicKey, challenge, key string, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.VerifyWithOptions(pub, JoinMessage(challenge, key), sig, &ed25519.Options{Context: PurposeJoin}) == nil
}
