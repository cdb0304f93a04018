package studio

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scellis/scellis/identity"
)

// A viewer token is a member's signed claim to watch the Studio until it
// expires: "sv1." + base64url(claims JSON) + "." + base64url(Ed25519ctx
// signature of the claims bytes under identity.PurposeViewerToken). The
// signer is the member itself (its identity key), and a node checks the
// signature against the member's public key in its federation file, so a
// token names nobody the federation does not list and cannot be made
// without the member's key. Nothing secret is stored on the node: the
// token is checked again on every request.

// Claims are what a viewer token says.
type Claims struct {
	Member string `json:"member"`
	Issued int64  `json:"iat"` // unix seconds
	Expiry int64  `json:"exp"` // unix seconds
	Nonce  string `json:"nonce"`
}

// MaxTTL bounds a viewer token's life: a leaked token is useless after a
// working day or so.
const MaxTTL = 24 * time.Hour

// clockSkew tolerates a token issued on a machine whose clock runs ahead.
const clockSkew = time.Minute

const tokenPrefix = "sv1."

var b64 = base64.RawURLEncoding

// Token errors; Verify wraps them.
var (
	ErrTokenMalformed = errors.New("studio: viewer token is malformed")
	ErrTokenExpired   = errors.New("studio: viewer token has expired")
	ErrTokenForged    = errors.New("studio: viewer token's signature does not verify")
	ErrTokenMember    = errors.New("studio: viewer token names no member of the federation")
	ErrTokenTTL       = errors.New("studio: viewer token lives longer than the maximum")
)

// IssueToken signs a viewer token for id's member, valid from now for ttl
// (at most MaxTTL). The member is found in fed by id's public key.
func IssueToken(id *identity.Identity, fed *identity.Federation, ttl time.Duration, now time.Time) (string, Claims, error) {
	m, ok := fed.Lookup(id.Public())
	if !ok {
		return "", Claims{}, fmt.Errorf("%w: the key %s is not in %s", ErrTokenMember, id.Public(), fed.File)
	}
	if ttl <= 0 || ttl > MaxTTL {
		return "", Claims{}, fmt.Errorf("%w: %s (allowed: more than 0, at most %s)", ErrTokenTTL, ttl, MaxTTL)
	}
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", Claims{}, err
	}
	c := Claims{Member: m.Name, Issued: now.Unix(), Expiry: now.Add(ttl).Unix(), Nonce: hex.EncodeToString(nonce[:])}
	body, err := json.Marshal(c)
	if err != nil {
		return "", Claims{}, err
	}
	sig := identity.Sign(id, identity.PurposeViewerToken, body)
	enc := base64.RawURLEncoding
	return tokenPrefix + enc.EncodeToString(body) + "." + enc.EncodeToString(sig), c, nil
}

// VerifyToken checks a viewer token against fed at time now and returns
// the member it admits.
func VerifyToken(tok string, fed *identity.Federation, now time.Time) (identity.Member, Claims, error) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok || len(tok) > 4096 {
		return identity.Member{}, Claims{}, ErrTokenMalformed
	}
	b64, s64, ok := strings.Cut(rest, ".")
	if !ok {
		return identity.Member{}, Claims{}, ErrTokenMalformed
	}
	enc := base64.RawURLEncoding
	body, err1 := enc.DecodeString(b64)
	sig, err2 := enc.DecodeString(s64)
	if err1 != nil || err2 != nil {
		return identity.Member{}, Claims{}, ErrTokenMalformed
	}
	var c Claims
	if err := json.Unmarshal(body, &c); err != nil || c.Member == "" {
		return identity.Member{}, Claims{}, ErrTokenMalformed
	}
	m, ok := fed.Member(c.Member)
	if !ok {
		return identity.Member{}, c, fmt.Errorf("%w: %q", ErrTokenMember, c.Member)
	}
	// The signature first: nothing in unsigned claims is believed.
	if !identity.Verify(m.PublicKey, identity.PurposeViewerToken, body, sig) {
		return identity.Member{}, c, ErrTokenForged
	}
	if !lifeOK(c) {
		return identity.Member{}, c, ErrTokenTTL
	}
	if c.Issued > now.Add(clockSkew).Unix() || now.Unix() >= c.Expiry {
		return identity.Member{}, c, ErrTokenExpired
	}
	return m, c, nil
}

// lifeOK reports whether c's life is more than 0 and at most MaxTTL,
// compared in whole seconds without overflow: both times must be
// non-negative (so Expiry-Issued cannot wrap) and the life is never
// multiplied into a Duration (which wrapped for a life of about 584
// years, and such a token was accepted until then).
func lifeOK(c Claims) bool {
	if c.Issued < 0 || c.Expiry <= c.Issued {
		return false
	}
	return c.Expiry-c.Issued <= int64(MaxTTL/time.Second)
}
