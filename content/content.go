// Package content gives Scellis one canonical encoding for everything that is
// hashed or signed — deterministic CBOR (RFC 8949 §4.2, core deterministic
// encoding) — and content references: Ref = "sha256:<hex>" of canonical bytes.
// The invariant: equal values have equal bytes, so equal refs, everywhere.
package content

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/fxamacker/cbor/v2"
)

// Ref names content by the SHA-256 of its bytes: "sha256:<64 hex digits>".
type Ref string

const refPrefix = "sha256:"

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	opts := cbor.CoreDetEncOptions()
	// Time is never hashed implicitly: callers encode instants as integers.
	opts.Time = cbor.TimeUnix
	var err error
	if encMode, err = opts.EncMode(); err != nil {
		panic("content: cbor encoding options: " + err.Error())
	}
	if decMode, err = (cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		MaxNestedLevels:  64,
		MaxArrayElements: 1 << 24,
		MaxMapPairs:      1 << 20,
		// Decoding into an untyped value gives the plain values content
		// works with: string-keyed maps and int64 integers.
		DefaultMapType: reflect.TypeOf(map[string]any(nil)),
		IntDec:         cbor.IntDecConvertSignedOrFail,
		// CheckCanonical already refuses tags; forbidding them here too
		// keeps the decoder safe should a caller ever bypass it.
		TagsMd: cbor.TagsForbidden,
	}).DecMode(); err != nil {
		panic("content: cbor decoding options: " + err.Error())
	}
}

// Encode returns the canonical bytes of v.
func Encode(v any) ([]byte, error) { return encMode.Marshal(v) }

// Decode parses canonical bytes into v. It refuses any byte string that is not
// the canonical encoding of its value (see CheckCanonical): duplicate or
// unsorted map keys, indefinite lengths, long-form heads, wide floats, tags.
func Decode(b []byte, v any) error {
	if err := CheckCanonical(b); err != nil {
		return err
	}
	return decMode.Unmarshal(b, v)
}

// DecodeFirst checks that b starts with one well-formed CBOR data item and
// returns the bytes after it. It tells where a self-delimiting item ends in
// bytes whose length field cannot be trusted (a damaged ledger frame).
func DecodeFirst(b []byte) (rest []byte, err error) {
	var v cbor.RawMessage
	return decMode.UnmarshalFirst(b, &v)
}

// Hash returns the Ref of raw bytes.
func Hash(b []byte) Ref {
	sum := sha256.Sum256(b)
	return Ref(refPrefix + hex.EncodeToString(sum[:]))
}

// HashOf returns the Ref of v's canonical encoding.
func HashOf(v any) (Ref, error) {
	b, err := Encode(v)
	if err != nil {
		return "", err
	}
	return Hash(b), nil
}

// ParseRef checks that s is a well-formed ref.
func ParseRef(s string) (Ref, error) {
	if !IsRef(s) {
		return "", fmt.Errorf("content: %s is not a ref (want sha256:<64 lowercase hex digits>)", quoteShort(s))
	}
	return Ref(s), nil
}

// IsRef reports whether s has the form of a Ref: "sha256:" and 64 lowercase
// hex digits, nothing else (no separators, dots or upper case), so that a
// ref can name a file.
func IsRef(s string) bool {
	if len(s) != len(refPrefix)+64 || s[:len(refPrefix)] != refPrefix {
		return false
	}
	for i := len(refPrefix); i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Hex is the 64 hex digits of a well-formed ref, to name a file or folder.
// It panics on a malformed ref: refs are validated where they are decoded
// (UnmarshalCBOR, UnmarshalJSON, UnmarshalText, ParseRef), so a bad one
// here is a bug that must not become a path.
func (r Ref) Hex() string {
	if !IsRef(string(r)) {
		panic(fmt.Sprintf("content: Ref.Hex of malformed ref %q", string(r)))
	}
	return string(r[len(refPrefix):])
}

// decodeRef validates a decoded ref. The empty string is the zero Ref,
// "none" (optional fields); anything else must be well formed.
func decodeRef(s string, r *Ref) error {
	if s != "" && !IsRef(s) {
		return fmt.Errorf("content: %s is not a ref (want sha256:<64 lowercase hex digits>)", quoteShort(s))
	}
	*r = Ref(s)
	return nil
}

// quoteShort quotes at most 80 bytes of s: a malformed ref in an error must
// not carry a caller's whole payload back.
func quoteShort(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "…"
	}
	return strconv.Quote(s)
}

// UnmarshalCBOR refuses a malformed ref where it is decoded.
func (r *Ref) UnmarshalCBOR(b []byte) error {
	var s string
	if err := decMode.Unmarshal(b, &s); err != nil {
		return err
	}
	return decodeRef(s, r)
}

// UnmarshalJSON refuses a malformed ref where it is decoded.
func (r *Ref) UnmarshalJSON(b []byte) error {
	// A well-formed ref is a plain quoted string with nothing to unescape
	// (IsRef allows no other byte): taken as is, without decoding the
	// literal again (a batch of reports holds two per item).
	if len(b) == len(refPrefix)+64+2 && b[0] == '"' && b[len(b)-1] == '"' {
		if s := string(b[1 : len(b)-1]); IsRef(s) {
			*r = Ref(s)
			return nil
		}
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	return decodeRef(s, r)
}

// UnmarshalText refuses a malformed ref where it is decoded (YAML, flags,
// map keys).
func (r *Ref) UnmarshalText(b []byte) error { return decodeRef(string(b), r) }

// Digest returns the 32 raw bytes of the hash.
func (r Ref) Digest() []byte {
	b, _ := hex.DecodeString(strings.TrimPrefix(string(r), refPrefix))
	return b
}

// Short is the first 12 hex digits, for people.
func (r Ref) Short() string {
	s := strings.TrimPrefix(string(r), refPrefix)
	if len(s) > 12 {
		s = s[:12]
	}
	return s
}

func (r Ref) String() string { return string(r) }
