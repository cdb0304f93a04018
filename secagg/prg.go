package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"

	"golang.org/x/crypto/chacha20"
	"golang.org/x/sys/cpu"

	"github.com/scellis/scellis/content"
)

// PRG names the cryptographic keystream that expands a 32-byte seed into a
// mask. Every party of a round must use the same one, so it is a round
// parameter (part of Params and of its digest), never a per-machine choice.
type PRG string

const (
	// AESCTR is AES-256 in counter mode with a zero IV: the fastest mask
	// generator on CPUs with AES instructions (x86 AES-NI, ARMv8 AES,
	// s390x CPACF). It is what Params uses when PRG is empty.
	AESCTR PRG = "aes256-ctr"
	// ChaCha20 is the IETF ChaCha20 stream cipher with a zero nonce: the
	// choice where AES has no hardware support and runs in software.
	ChaCha20 PRG = "chacha20"
)

// DefaultPRG returns the keystream a coordinator should pick for a round run
// on machines like this one: AESCTR when the CPU has AES instructions,
// ChaCha20 otherwise. BenchmarkKeystream (bench_test.go) justifies the choice.
func DefaultPRG() PRG {
	if cpu.X86.HasAES || cpu.ARM64.HasAES || cpu.S390X.HasAES {
		return AESCTR
	}
	return ChaCha20
}

func (g PRG) valid() bool { return g == AESCTR || g == ChaCha20 }

var (
	zeroIV    [aes.BlockSize]byte
	zeroNonce [chacha20.NonceSize]byte
)

// stream returns the keystream of g under a 32-byte key. Each key is derived
// through HKDF for one purpose and used for one stream only, which is why a
// fixed IV/nonce is safe.
func (g PRG) stream(key []byte) cipher.Stream {
	switch g {
	case AESCTR:
		b, err := aes.NewCipher(key)
		if err != nil {
			panic("secagg: aes key: " + err.Error())
		}
		return cipher.NewCTR(b, zeroIV[:])
	case ChaCha20:
		s, err := chacha20.NewUnauthenticatedCipher(key, zeroNonce[:])
		if err != nil {
			panic("secagg: chacha20 key: " + err.Error())
		}
		return s
	}
	panic(fmt.Sprintf("secagg: unknown PRG %q reached the keystream", string(g)))
}

// zeroChunk is the plaintext a keystream is XORed onto to read it out.
var zeroChunk [tileBytes]byte

// mask is one keystream to add to a vector (sign > 0) or subtract from it.
type mask struct {
	key  []byte
	sign int
}

// Key derivation labels. Every derived key is bound to the round's session
// digest (the hash of its Params) and to the parties it concerns.
const (
	labelSelfMask = "scellis/secagg/v1/self-mask"
	labelPairMask = "scellis/secagg/v1/pair-mask"
	labelShareKey = "scellis/secagg/v1/share-key"
	labelShareAD  = "scellis/secagg/v1/share-ad"
	labelCommit   = "scellis/secagg/v1/seed-commit"
	labelAdvert   = "scellis/secagg/v1/advert"
	labelGraph    = "scellis/secagg/v1/harary-graph"
)

// deriveKey is HKDF-SHA-256(secret, salt = session digest, info =
// canonical encoding of the label and the parties) → 32 bytes.
func deriveKey(secret, session []byte, label string, parties ...string) []byte {
	k, err := hkdf.Key(sha256.New, secret, session, string(mustEncode(append([]string{label}, parties...))), 32)
	if err != nil {
		panic("secagg: hkdf: " + err.Error())
	}
	return k
}

// selfMaskKey keys PRG(b_u).
func selfMaskKey(seed, session []byte, u string) []byte {
	return deriveKey(seed, session, labelSelfMask, u)
}

// pairMaskKey keys PRG(s_uv); it is symmetric in u and v.
func pairMaskKey(shared, session []byte, u, v string) []byte {
	lo, hi := u, v
	if hi < lo {
		lo, hi = hi, lo
	}
	return deriveKey(shared, session, labelPairMask, lo, hi)
}

// pairSign is Δ_{u,v} of the paper: +1 when u sorts before v, −1 after, so
// that the pair's two masks cancel in the sum.
func pairSign(u, v string) int {
	if u < v {
		return 1
	}
	return -1
}

// mustEncode canonically encodes values the package builds itself; a
// failure is a programming error.
func mustEncode(v any) []byte {
	b, err := content.Encode(v)
	if err != nil {
		panic("secagg: canonical encoding: " + err.Error())
	}
	return b
}
