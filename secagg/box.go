package secagg

import (
	"crypto/rand"
	"fmt"
	"io"

	"golang.org/x/crypto/chacha20poly1305"
)

// SealBox seals pt to key under ad with XChaCha20-Poly1305 and a random
// nonce, which it puts in front of the ciphertext. Every sealed box of
// secure aggregation uses it: the shares of the pairwise and SecAgg+
// clients, the sealed shares a child forwards to its parent, and the key
// shares of the threshold-he parties (secagg/he).
func SealBox(key, ad, pt []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, chacha20poly1305.NonceSizeX, chacha20poly1305.NonceSizeX+len(pt)+chacha20poly1305.Overhead)
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, pt, ad), nil
}

// OpenBox opens a box SealBox made with the same key and ad, or fails if
// it does not authenticate.
func OpenBox(key, ad, sealed []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < chacha20poly1305.NonceSizeX {
		return nil, fmt.Errorf("secagg: sealed box too short")
	}
	return aead.Open(nil, sealed[:chacha20poly1305.NonceSizeX], sealed[chacha20poly1305.NonceSizeX:], ad)
}
