package he

import (
	"bytes"
	"crypto/ed25519"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	sid "github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// Advert is a site's first message: its X25519 key for the boxes that
// carry Shamir shares of secret keys to it, signed with its identity key.
type Advert struct {
	Round  string `cbor:"round"`
	Site   string `cbor:"site"`
	Params []byte `cbor:"params"` // the session digest
	BoxKey []byte `cbor:"box_key"`
	Sig    []byte `cbor:"sig"`
}

type advertSigned struct {
	Domain string `cbor:"domain"`
	Round  string `cbor:"round"`
	Site   string `cbor:"site"`
	Params []byte `cbor:"params"`
	BoxKey []byte `cbor:"box_key"`
}

func (a *Advert) signedBytes() []byte {
	return mustEncode(advertSigned{Domain: "scellis/he/v1/advert", Round: a.Round, Site: a.Site, Params: a.Params, BoxKey: a.BoxKey})
}

// KeySet relays the adverts the aggregator accepted (the set U1).
type KeySet struct {
	Round   string   `cbor:"round"`
	Adverts []Advert `cbor:"adverts"`
}

// Box is a Shamir share of a secret key sealed to one site.
type Box struct {
	To     string `cbor:"to"`
	Sealed []byte `cbor:"sealed"`
}

// Shares is a site's second message: one sealed Shamir share of its
// secret key per other site. No public key is formed: each site encrypts
// under its own secret key (see Ciphertext), and the boxes authenticate
// their sender (keys from the signed adverts).
type Shares struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	Boxes []Box  `cbor:"boxes"`
}

// Dealt is what one site of U2 sent to the delivery's recipient.
type Dealt struct {
	From string `cbor:"from"`
	Box  []byte `cbor:"box"` // empty for the recipient's own entry
}

// Delivery is what the aggregator relays to one site of U2 after key
// sharing: the sites of U2 and the box each sent to this site.
type Delivery struct {
	Round string  `cbor:"round"`
	To    string  `cbor:"to"`
	From  []Dealt `cbor:"from"`
}

// Ciphertext is a site's encrypted input: ⌈Dim/(N·lanes)⌉ BGV
// ciphertexts under the site's own secret key s_i, each (c0, a_k) with
// a_k the round's k-th public polynomial (the CRS), so only the c0 travel.
// The sum of the sites' c0 with a_k is an encryption of the summed inputs
// under Σ s_i, which t sites decrypt from their Shamir shares.
type Ciphertext struct {
	Round string   `cbor:"round"`
	From  string   `cbor:"from"`
	C0    [][]byte `cbor:"c0"` // marshalled ring polynomials, NTT domain
}

// DecryptRequest asks the Decryptors (exactly t sites) for partial
// decryptions of the sum of the Contributors' ciphertexts: each decryptor
// combines the Shamir shares it holds of the contributors' keys and
// switches the round's public polynomials (all a partial decryption
// needs). Attempt counts the requests of the round: a new one follows
// when a decryptor did not answer.
type DecryptRequest struct {
	Round        string   `cbor:"round"`
	Attempt      int      `cbor:"attempt"`
	Contributors []string `cbor:"contributors"`
	Decryptors   []string `cbor:"decryptors"`
}

// DecryptShare is one decryptor's partial decryption, smudged.
type DecryptShare struct {
	Round   string   `cbor:"round"`
	From    string   `cbor:"from"`
	Attempt int      `cbor:"attempt"`
	Shares  [][]byte `cbor:"shares"`
}

// Result is the decrypted sum.
type Result struct {
	Round string
	// Sum is Σ y_u over the contributors, exactly (the encoded integers).
	Sum []int64
	// Contributors are the sites whose ciphertexts the sum holds (U3).
	Contributors []string
	// Dropped are the sites that shared keys but sent no ciphertext.
	Dropped []string
	// Decryptors are the t sites whose partial decryptions opened it.
	Decryptors []string
}

func mustEncode(v any) []byte {
	b, err := content.Encode(v)
	if err != nil {
		panic("he: canonical encoding of a message failed: " + err.Error())
	}
	return b
}

// Marshal returns the canonical encoding of the message.
func (m *Advert) Marshal() ([]byte, error)         { return content.Encode(m) }
func (m *KeySet) Marshal() ([]byte, error)         { return content.Encode(m) }
func (m *Shares) Marshal() ([]byte, error)         { return content.Encode(m) }
func (m *Delivery) Marshal() ([]byte, error)       { return content.Encode(m) }
func (m *Ciphertext) Marshal() ([]byte, error)     { return content.Encode(m) }
func (m *DecryptRequest) Marshal() ([]byte, error) { return content.Encode(m) }
func (m *DecryptShare) Marshal() ([]byte, error)   { return content.Encode(m) }

func malformed(kind, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.SecAggMalformed, "threshold-he "+kind, format, args...).
		WithHelp("the sender runs another version or round parameters")
}

// parse decodes b into v with the framing every secure-aggregation
// message shares (secagg.DecodeMessage: canonical encoding only).
func parse[T any](kind string, b []byte, v *T) (*T, error) {
	if err := secagg.DecodeMessage("threshold-he "+kind, b, v); err != nil {
		return nil, err
	}
	return v, nil
}

// ParseAdvert parses the canonical encoding of an Advert.
func ParseAdvert(b []byte) (*Advert, error) { return parse("key advert", b, new(Advert)) }

// ParseKeySet parses the canonical encoding of a KeySet.
func ParseKeySet(b []byte) (*KeySet, error) { return parse("key set", b, new(KeySet)) }

// ParseShares parses the canonical encoding of a Shares message.
func ParseShares(b []byte) (*Shares, error) { return parse("shares", b, new(Shares)) }

// ParseDelivery parses the canonical encoding of a Delivery.
func ParseDelivery(b []byte) (*Delivery, error) { return parse("delivery", b, new(Delivery)) }

// ParseCiphertext parses the canonical encoding of a Ciphertext.
func ParseCiphertext(b []byte) (*Ciphertext, error) { return parse("ciphertext", b, new(Ciphertext)) }

// ParseDecryptRequest parses the canonical encoding of a DecryptRequest.
func ParseDecryptRequest(b []byte) (*DecryptRequest, error) {
	return parse("decrypt request", b, new(DecryptRequest))
}

// ParseDecryptShare parses the canonical encoding of a DecryptShare.
func ParseDecryptShare(b []byte) (*DecryptShare, error) {
	return parse("decrypt share", b, new(DecryptShare))
}

func signAdvert(key ed25519.PrivateKey, a *Advert) []byte { return signBytes(key, a.signedBytes()) }

// signBytes signs as Ed25519ctx under identity.PurposeHEAdvert, so these
// signatures never verify as any other signature of the site's key.
func signBytes(key ed25519.PrivateKey, msg []byte) []byte {
	return sid.Sign(sid.FromPrivateKey(key), sid.PurposeHEAdvert, msg)
}

func verify(pub ed25519.PublicKey, msg, sig []byte) bool {
	var k sid.PublicKey
	if len(pub) != len(k) {
		return false
	}
	copy(k[:], pub)
	return sid.Verify(k, sid.PurposeHEAdvert, msg, sig)
}

func (r *round) checkAdvert(a *Advert) error {
	if err := r.checkRound(a.Round); err != nil {
		return err
	}
	pub, ok := r.keys[a.Site]
	if !ok {
		return diag.New(diag.SecAggUnknownSite, r.subject(), "an advert from %q, not a member", a.Site).WithHelp("only the round's members take part")
	}
	if !bytes.Equal(a.Params, r.session) {
		return diag.New(diag.SecAggParamsMismatch, r.subject(), "site %q runs other round parameters", a.Site).
			WithHelp("every site of a round must use the same Params (members, threshold, dimension, bound, seed)")
	}
	if len(a.BoxKey) != 32 || !verify(pub, a.signedBytes(), a.Sig) {
		return diag.New(diag.SecAggBadSignature, r.subject(), "the advert of %q is unsigned or mis-signed", a.Site).
			WithHelp("check the site's public key in the federation file")
	}
	return nil
}
