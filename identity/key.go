package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/scellis/scellis/diag"
)

// PublicKeyPrefix starts the text form of a public key.
const PublicKeyPrefix = "ed25519:"

// PublicKey is an Ed25519 public key. Its text form, used in federation
// files and identity.pub, is "ed25519:" followed by the 32 key bytes in
// standard padded base64 (44 characters); every key has exactly one text form.
//
// Compare keys with Equal (constant time), not ==.
type PublicKey [ed25519.PublicKeySize]byte

// ParsePublicKey parses the text form of a public key. A malformed key is an
// SC1102 diagnostic.
func ParsePublicKey(s string) (PublicKey, error) {
	var k PublicKey
	bad := func(format string, args ...any) (PublicKey, error) {
		return PublicKey{}, diag.New(diag.PublicKeyMalformed, "public key", format, args...).
			WithHelp("copy the whole line from the member's identity.pub (it starts with %q)", PublicKeyPrefix)
	}
	rest, ok := strings.CutPrefix(s, PublicKeyPrefix)
	if !ok {
		return bad("a public key must start with %q", PublicKeyPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(rest)
	if err != nil {
		return bad("the key after %q is not valid base64", PublicKeyPrefix)
	}
	if len(b) != len(k) {
		return bad("the key is %d bytes long; an Ed25519 public key has %d", len(b), len(k))
	}
	copy(k[:], b)
	if k.String() != s {
		return bad("the key is not in canonical base64")
	}
	return k, nil
}

// String returns the text form "ed25519:<base64>".
func (k PublicKey) String() string {
	return PublicKeyPrefix + base64.StdEncoding.EncodeToString(k[:])
}

// Equal reports whether k and o are the same key, in constant time.
func (k PublicKey) Equal(o PublicKey) bool {
	return subtle.ConstantTimeCompare(k[:], o[:]) == 1
}

// Ed25519 returns the key as a crypto/ed25519 key (a fresh copy).
func (k PublicKey) Ed25519() ed25519.PublicKey {
	return append(ed25519.PublicKey(nil), k[:]...)
}

// MarshalText implements encoding.TextMarshaler with the text form.
func (k PublicKey) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParsePublicKey.
func (k *PublicKey) UnmarshalText(b []byte) error {
	p, err := ParsePublicKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

func publicKeyOf(pub ed25519.PublicKey) (PublicKey, bool) {
	var k PublicKey
	if len(pub) != len(k) {
		return k, false
	}
	copy(k[:], pub)
	return k, true
}

// Identity is a node's Ed25519 key pair. The private half never leaves the
// value: fmt and slog show only its public key (String, GoString), and
// encoders see no exported field.
//
// A running node may rotate its key in place (Replace): every holder of the
// *Identity — TLS configs, signers — then uses the new key. The key pair
// sits behind a shared atomic pointer so that this is safe while
// handshakes and signatures are under way.
type Identity struct {
	kp *atomic.Pointer[keyPair]
}

// keyPair is one immutable Ed25519 key pair.
type keyPair struct {
	priv ed25519.PrivateKey
	pub  PublicKey
}

// Generate makes a new identity from crypto/rand.
func Generate() (*Identity, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generating a key: %w", err)
	}
	return fromPrivate(priv), nil
}

// NewFromSeed derives an identity from a 32-byte Ed25519 seed (RFC 8032).
// The seed is the private key: use it for tests and shared vectors only.
func NewFromSeed(seed [ed25519.SeedSize]byte) *Identity {
	return fromPrivate(ed25519.NewKeyFromSeed(seed[:]))
}

func fromPrivate(priv ed25519.PrivateKey) *Identity {
	pub, _ := publicKeyOf(priv.Public().(ed25519.PublicKey))
	kp := &atomic.Pointer[keyPair]{}
	kp.Store(&keyPair{priv: priv, pub: pub})
	return &Identity{kp: kp}
}

func (id *Identity) keys() *keyPair { return id.kp.Load() }

// Replace makes id use next's key from now on (a key rotation): new TLS
// handshakes present a certificate for the new key and new signatures are
// made with it. Connections already established keep their session.
func (id *Identity) Replace(next *Identity) { id.kp.Store(next.keys()) }

// Public returns the identity's public key.
func (id *Identity) Public() PublicKey { return id.keys().pub }

// PrivateKey returns the Ed25519 private key, for the in-process signers
// that take one (the privacy ledger, secure-aggregation adverts). Never log
// or send it.
func (id *Identity) PrivateKey() ed25519.PrivateKey { return id.keys().priv }

// String shows the public key only.
func (id Identity) String() string { return "identity " + id.Public().String() }

// GoString shows the public key only, so %#v leaks nothing either.
func (id Identity) GoString() string { return "identity.Identity{" + id.Public().String() + "}" }

// FromPrivateKey wraps an Ed25519 private key held elsewhere (a privacy
// ledger's key file) as an Identity, so that it signs through Sign with a
// purpose like every other key.
func FromPrivateKey(priv ed25519.PrivateKey) *Identity {
	if len(priv) != ed25519.PrivateKeySize {
		panic("identity: FromPrivateKey needs an Ed25519 private key")
	}
	return fromPrivate(priv)
}
