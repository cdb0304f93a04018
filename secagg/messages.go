package secagg

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"slices"
	"unicode/utf8"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	sid "github.com/scellis/scellis/identity"
)

// The protocol's messages, in the order a round sends them:
//
//	client → server   Advert          (AdvertiseKeys)
//	server → clients  KeySet
//	client → server   GraphReveal     (SecAgg+ on a sparse graph: graphseed.go)
//	server → clients  GraphRevealSet
//	client → server   Shares          (ShareKeys)
//	server → client   ShareDelivery
//	client → server   MaskedInput     (MaskedInputCollection)
//	server → clients  UnmaskRequest   the survivor set, unsigned
//	client → server   SurvivorSig     (ConsistencyCheck)
//	server → clients  UnmaskRequest   the same set, with the signatures
//	client → server   Unmasking       (Unmasking)
//
// Every message names its round. On the wire a message is its canonical
// CBOR encoding (content.Encode; Marshal does the same); the Parse functions
// accept exactly those bytes — a non-canonical or unknown-field encoding is
// refused — so parse-then-marshal gives back the input. Parsing checks the
// shape of a message (sizes, identifiers); whether it fits the round is the
// Client's and Server's business.

// Advert is a client's two fresh X25519 public keys for the round, signed
// with its long-term Ed25519 identity key.
type Advert struct {
	Round  string `cbor:"round"`
	Client string `cbor:"client"`
	// Params is the session digest of the round's Params (Params.Digest).
	Params []byte `cbor:"params"`
	// EncKey encrypts Shamir shares to this client (c_u^PK in the paper).
	EncKey []byte `cbor:"enc_key"`
	// MaskKey agrees the pairwise mask seeds (s_u^PK in the paper).
	MaskKey []byte `cbor:"mask_key"`
	// GraphCommit commits to the client's share of the graph's randomness
	// in a SecAgg+ round on a sparse graph (graphseed.go); empty otherwise.
	GraphCommit []byte `cbor:"graph_commit,omitempty"`
	// Sig is the Ed25519 signature over advertSigned.
	Sig []byte `cbor:"sig"`
}

// advertSigned is what an advert's signature covers.
type advertSigned struct {
	Domain  string `cbor:"domain"`
	Round   string `cbor:"round"`
	Client  string `cbor:"client"`
	Params  []byte `cbor:"params"`
	EncKey  []byte `cbor:"enc_key"`
	MaskKey []byte `cbor:"mask_key"`
	// GraphCommit is omitted when empty, so an advert without one signs
	// the bytes it always did.
	GraphCommit []byte `cbor:"graph_commit,omitempty"`
}

func (a *Advert) signedBytes() []byte {
	return mustEncode(advertSigned{Domain: labelAdvert, Round: a.Round, Client: a.Client, Params: a.Params, EncKey: a.EncKey, MaskKey: a.MaskKey, GraphCommit: a.GraphCommit})
}

// signAdvert signs a with a site's identity key as Ed25519ctx under
// identity.PurposeSecaggAdvert, so an advert signature never verifies as
// any other signature the key makes (TLS, receipts, ledger entries).
func signAdvert(key ed25519.PrivateKey, a *Advert) []byte {
	return sid.Sign(sid.FromPrivateKey(key), sid.PurposeSecaggAdvert, a.signedBytes())
}

// verifyAdvert reports whether a.Sig is pub's advert signature of a.
func verifyAdvert(pub ed25519.PublicKey, a *Advert) bool {
	var k sid.PublicKey
	if len(pub) != len(k) {
		return false
	}
	copy(k[:], pub)
	return sid.Verify(k, sid.PurposeSecaggAdvert, a.signedBytes(), a.Sig)
}

// KeySet is the server's relay of the adverts it accepted (the set U1).
type KeySet struct {
	Round   string   `cbor:"round"`
	Adverts []Advert `cbor:"adverts"`
}

// Box is one Shamir share pair encrypted from one client to another.
type Box struct {
	From string `cbor:"from"`
	To   string `cbor:"to"`
	// Sealed is a 24-byte nonce followed by the XChaCha20-Poly1305
	// ciphertext of the shares, under a key only From and To can derive.
	Sealed []byte `cbor:"sealed"`
}

// Shares is a client's encrypted shares for every other client of U1.
type Shares struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	// Commit is a hash of the client's self-mask seed b_u, bound to the
	// round and the client, so the server can check the seed it
	// reconstructs. (An addition to the paper; see docs/secagg.md.)
	Commit []byte `cbor:"commit"`
	Boxes  []Box  `cbor:"boxes"`
}

// ShareDelivery is the server's relay to one client of the boxes addressed
// to it; the senders (plus the recipient) are the set U2.
type ShareDelivery struct {
	Round string `cbor:"round"`
	To    string `cbor:"to"`
	Boxes []Box  `cbor:"boxes"`
}

// MaskedInput is a client's input vector in the ring, masked.
type MaskedInput struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	// Masked holds the ring vector as little-endian uint64 words:
	// 8·Dim bytes, plus 8 for the weight when the round is weighted.
	Masked []byte `cbor:"masked"`
}

// UnmaskRequest names, for the survivors, which clients sent a masked
// input (survivors, the set U3) and which shared keys but did not (dropped).
// It travels twice: first unsigned, for every survivor to check and sign
// (Client.SignSurvivors, the consistency round), then with Signatures —
// the signatures the server collected (from U4 ⊆ U3) — as the request to
// unmask (Client.Unmask), which a client answers only if enough sites
// signed the very set it signed.
type UnmaskRequest struct {
	Round     string   `cbor:"round"`
	Survivors []string `cbor:"survivors"`
	Dropped   []string `cbor:"dropped"`
	// Signatures are the survivors' signatures over the set, by signer
	// (none in the unsigned announcement).
	Signatures []Signature `cbor:"signatures,omitempty"`
}

// Signature is one site's signature over a survivor set.
type Signature struct {
	Of  string `cbor:"of"`
	Sig []byte `cbor:"sig"`
}

// SurvivorSig is a survivor's answer in the consistency round: its
// signature, with its identity key, over the survivor set it was shown.
type SurvivorSig struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	Sig   []byte `cbor:"sig"`
}

// survivorsSigned is what a survivor signature covers: the session digest
// (so the params, members and round), the round ID, and the set, sorted.
type survivorsSigned struct {
	Domain    string   `cbor:"domain"`
	Params    []byte   `cbor:"params"`
	Round     string   `cbor:"round"`
	Survivors []string `cbor:"survivors"`
	Dropped   []string `cbor:"dropped"`
}

// survivorStatement is the bytes a site signs for the survivor set
// (survivors, dropped) of the round r: both sorted, so the order the
// server lists them in does not matter.
func survivorStatement(r *round, survivors, dropped []string) []byte {
	return mustEncode(survivorsSigned{Domain: labelSurvivors, Params: r.session, Round: r.id,
		Survivors: sortedCopy(survivors), Dropped: sortedCopy(dropped)})
}

// signSurvivors signs a survivor statement as Ed25519ctx under
// identity.PurposeSecaggSurvivors.
func signSurvivors(key ed25519.PrivateKey, statement []byte) []byte {
	return sid.Sign(sid.FromPrivateKey(key), sid.PurposeSecaggSurvivors, statement)
}

// verifySurvivors reports whether sig is pub's signature of statement.
func verifySurvivors(pub ed25519.PublicKey, statement, sig []byte) bool {
	var k sid.PublicKey
	if len(pub) != len(k) || len(sig) != ed25519.SignatureSize {
		return false
	}
	copy(k[:], pub)
	return sid.Verify(k, sid.PurposeSecaggSurvivors, statement, sig)
}

// labelSurvivors is the domain of a survivor statement.
const labelSurvivors = "scellis/secagg/v1/survivors"

func sortedCopy(ids []string) []string {
	out := slices.Clone(ids)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// Share is a client's Shamir share of one other client's secret.
type Share struct {
	Of    string `cbor:"of"`
	Value []byte `cbor:"value"`
}

// Unmasking is a survivor's answer to an UnmaskRequest: its shares of the
// self-mask seed of every survivor and of the mask key of every dropped
// client — never both for one client.
type Unmasking struct {
	Round string  `cbor:"round"`
	From  string  `cbor:"from"`
	Seeds []Share `cbor:"seeds"`
	Keys  []Share `cbor:"keys"`
	// Sealed, in a sub-cohort of a hierarchical round (Params.Parent),
	// replaces Seeds and Keys: they travel sealed to the parent, so the
	// relaying child cannot read them (docs/secagg.md, "Hierarchical
	// secure aggregation").
	Sealed []byte `cbor:"sealed,omitempty"`
}

// sharePayload is the plaintext inside a Box.
type sharePayload struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	To    string `cbor:"to"`
	Seed  []byte `cbor:"seed"` // share of b_from
	Key   []byte `cbor:"key"`  // share of s_from^SK
}

// Sizes of message fields.
const (
	keySize      = 32 // X25519 keys, seeds, digests, shares
	sealedSize   = chacha20poly1305.NonceSizeX + chacha20poly1305.Overhead
	maxSealedLen = 1024
)

func malformed(kind, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.SecAggMalformed, kind, format, args...).
		WithHelp("the sender runs an incompatible or faulty secure aggregation; drop the message")
}

func checkRoundID(kind, r string) error {
	if r == "" || len(r) > maxRoundLen || !utf8.ValidString(r) {
		return malformed(kind, "round ID missing or invalid")
	}
	return nil
}

func checkID(kind, field, id string) error {
	if !validID(id) {
		return malformed(kind, "%s %q is not a valid client ID", field, id)
	}
	return nil
}

func checkLen(kind, field string, b []byte, n int) error {
	if len(b) != n {
		return malformed(kind, "%s is %d bytes, want %d", field, len(b), n)
	}
	return nil
}

func (a *Advert) validate() error {
	const k = "key advert"
	if err := checkRoundID(k, a.Round); err != nil {
		return err
	}
	if err := checkID(k, "client", a.Client); err != nil {
		return err
	}
	if err := checkLen(k, "params digest", a.Params, sha256.Size); err != nil {
		return err
	}
	if err := checkLen(k, "encryption key", a.EncKey, keySize); err != nil {
		return err
	}
	if err := checkLen(k, "mask key", a.MaskKey, keySize); err != nil {
		return err
	}
	if len(a.GraphCommit) > 0 {
		if err := checkLen(k, "graph commitment", a.GraphCommit, sha256.Size); err != nil {
			return err
		}
	}
	if len(a.Sig) != ed25519.SignatureSize {
		return diag.New(diag.SecAggBadSignature, k+" of "+a.Client, "advert carries a %d-byte signature, want %d", len(a.Sig), ed25519.SignatureSize).
			WithHelp("adverts must be signed with the client's Ed25519 identity key")
	}
	return nil
}

func (m *KeySet) validate() error {
	const k = "key set"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if len(m.Adverts) > MaxSitesPlus {
		return malformed(k, "%d adverts, at most %d", len(m.Adverts), MaxSitesPlus)
	}
	for i := range m.Adverts {
		if err := m.Adverts[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

func (b *Box) validate(k string) error {
	if err := checkID(k, "box sender", b.From); err != nil {
		return err
	}
	if err := checkID(k, "box recipient", b.To); err != nil {
		return err
	}
	if len(b.Sealed) < sealedSize || len(b.Sealed) > maxSealedLen {
		return malformed(k, "sealed box of %d bytes", len(b.Sealed))
	}
	return nil
}

func validateBoxes(k string, bs []Box) error {
	if len(bs) > MaxSites {
		return malformed(k, "%d boxes, at most %d", len(bs), MaxSites)
	}
	for i := range bs {
		if err := bs[i].validate(k); err != nil {
			return err
		}
	}
	return nil
}

func (m *Shares) validate() error {
	const k = "shares"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "sender", m.From); err != nil {
		return err
	}
	if err := checkLen(k, "seed commitment", m.Commit, sha256.Size); err != nil {
		return err
	}
	return validateBoxes(k, m.Boxes)
}

func (m *ShareDelivery) validate() error {
	const k = "share delivery"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "recipient", m.To); err != nil {
		return err
	}
	return validateBoxes(k, m.Boxes)
}

func (m *MaskedInput) validate() error {
	const k = "masked input"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "sender", m.From); err != nil {
		return err
	}
	// 4 bytes a coordinate in Z_2^32, 8 in Z_2^64: the server checks the
	// exact length against the round.
	if len(m.Masked) == 0 || len(m.Masked)%4 != 0 || len(m.Masked) > 8*(MaxDim+1) {
		return malformed(k, "masked vector of %d bytes is not a whole number of ring elements", len(m.Masked))
	}
	return nil
}

func (m *UnmaskRequest) validate() error {
	const k = "unmask request"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if len(m.Survivors)+len(m.Dropped) > MaxSitesPlus {
		return malformed(k, "names %d clients, at most %d", len(m.Survivors)+len(m.Dropped), MaxSitesPlus)
	}
	for _, id := range m.Survivors {
		if err := checkID(k, "survivor", id); err != nil {
			return err
		}
	}
	for _, id := range m.Dropped {
		if err := checkID(k, "dropped client", id); err != nil {
			return err
		}
	}
	if len(m.Signatures) > MaxSitesPlus {
		return malformed(k, "%d signatures, at most %d", len(m.Signatures), MaxSitesPlus)
	}
	for _, sg := range m.Signatures {
		if err := checkID(k, "signer", sg.Of); err != nil {
			return err
		}
		if err := checkLen(k, "signature", sg.Sig, ed25519.SignatureSize); err != nil {
			return err
		}
	}
	return nil
}

func (m *SurvivorSig) validate() error {
	const k = "survivor signature"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "sender", m.From); err != nil {
		return err
	}
	return checkLen(k, "signature", m.Sig, ed25519.SignatureSize)
}

func validateShares(k string, ss []Share) error {
	if len(ss) > MaxSites {
		return malformed(k, "%d shares, at most %d", len(ss), MaxSites)
	}
	for _, s := range ss {
		if err := checkID(k, "share owner", s.Of); err != nil {
			return err
		}
		if err := checkLen(k, "share", s.Value, keySize); err != nil {
			return err
		}
	}
	return nil
}

func (m *Unmasking) validate() error {
	const k = "unmasking"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "sender", m.From); err != nil {
		return err
	}
	if err := validateShares(k, m.Seeds); err != nil {
		return err
	}
	if len(m.Seeds)+len(m.Keys) > MaxSites {
		return malformed(k, "%d shares, at most %d", len(m.Seeds)+len(m.Keys), MaxSites)
	}
	if m.Sealed != nil && (len(m.Seeds)+len(m.Keys) > 0 || len(m.Sealed) < sealedSize || len(m.Sealed) > maxSealedUnmasking) {
		return malformed(k, "sealed shares of %d bytes beside %d shares in the clear", len(m.Sealed), len(m.Seeds)+len(m.Keys))
	}
	return validateShares(k, m.Keys)
}

// Marshal returns the canonical encoding of the advert.
func (a *Advert) Marshal() ([]byte, error) { return content.Encode(a) }

// Marshal returns the canonical encoding of the key set.
func (m *KeySet) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the shares.
func (m *Shares) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the delivery.
func (m *ShareDelivery) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the masked input.
func (m *MaskedInput) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the request.
func (m *UnmaskRequest) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the survivor signature.
func (m *SurvivorSig) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the unmasking.
func (m *Unmasking) Marshal() ([]byte, error) { return content.Encode(m) }

// DecodeMessage decodes b, a message of kind, into v and refuses any
// encoding but the canonical one, so that parsing then marshalling gives
// back b: the framing of every secure-aggregation message, pairwise
// masking's here and threshold-he's (package he). Refusals are SC6105.
func DecodeMessage(kind string, b []byte, v any) error {
	if err := content.Decode(b, v); err != nil {
		return malformed(kind, "cannot decode: %v", err)
	}
	again, err := content.Encode(v)
	if err != nil || !bytes.Equal(again, b) {
		return malformed(kind, "not in canonical encoding (unknown fields, non-minimal lengths or unsorted keys)")
	}
	return nil
}

// parse decodes b into v (DecodeMessage) and checks the message's shape.
func parse[T interface{ validate() error }](kind string, b []byte, v T) (T, error) {
	var zero T
	if err := DecodeMessage(kind, b, v); err != nil {
		return zero, err
	}
	if err := v.validate(); err != nil {
		return zero, err
	}
	return v, nil
}

// ParseAdvert parses the canonical encoding of an Advert.
func ParseAdvert(b []byte) (*Advert, error) { return parse("key advert", b, new(Advert)) }

// ParseKeySet parses the canonical encoding of a KeySet.
func ParseKeySet(b []byte) (*KeySet, error) { return parse("key set", b, new(KeySet)) }

// ParseShares parses the canonical encoding of a Shares message.
func ParseShares(b []byte) (*Shares, error) { return parse("shares", b, new(Shares)) }

// ParseShareDelivery parses the canonical encoding of a ShareDelivery.
func ParseShareDelivery(b []byte) (*ShareDelivery, error) {
	return parse("share delivery", b, new(ShareDelivery))
}

// ParseMaskedInput parses the canonical encoding of a MaskedInput. The
// masked vector is not copied: m.Masked shares b's memory, so the caller
// keeps b unchanged while it uses m. It accepts exactly the bytes
// DecodeMessage would (TestParseMaskedInputAgrees) without its two copies of
// the vector (the decoded field and the re-encoding to compare against b):
// at model size these were most of an aggregator's memory (issue 32).
func ParseMaskedInput(b []byte) (*MaskedInput, error) {
	m, err := decodeMaskedInput(b)
	if err != nil {
		return nil, err
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeMaskedInput reads the canonical encoding of a MaskedInput in place:
// a map of exactly its three fields, in canonical key order (from, round,
// masked: shorter keys first), the IDs as text, the vector as a byte
// string. content.CheckCanonical checks the heads (shortest, definite,
// keys sorted) first, so matching the fields one by one leaves exactly the
// bytes Marshal writes.
func decodeMaskedInput(b []byte) (*MaskedInput, error) {
	const kind = "masked input"
	if err := content.CheckCanonical(b); err != nil {
		return nil, malformed(kind, "cannot decode: %v", err)
	}
	notCanonical := malformed(kind, "not in canonical encoding (unknown fields, non-minimal lengths or unsorted keys)")
	major, n, off := cborHead(b, 0)
	if major != cborMap || n != 3 {
		return nil, notCanonical
	}
	var m MaskedInput
	fields := [...]struct {
		key   string
		major byte
		to    func(v []byte)
	}{
		{"from", cborText, func(v []byte) { m.From = string(v) }},
		{"round", cborText, func(v []byte) { m.Round = string(v) }},
		{"masked", cborBytes, func(v []byte) { m.Masked = v[:len(v):len(v)] }},
	}
	for _, f := range fields {
		var key, val []byte
		if key, off = cborString(b, off, cborText); key == nil || string(key) != f.key {
			return nil, notCanonical
		}
		if val, off = cborString(b, off, f.major); val == nil {
			return nil, notCanonical
		}
		if f.major == cborText && !utf8.Valid(val) {
			return nil, malformed(kind, "cannot decode: field %q is not valid UTF-8", f.key)
		}
		f.to(val)
	}
	if off != len(b) {
		return nil, notCanonical
	}
	return &m, nil
}

// CBOR major types (RFC 8949 §3.1) that decodeMaskedInput reads.
const (
	cborBytes = 2
	cborText  = 3
	cborMap   = 5
)

// cborHead reads the head at b[off] of bytes content.CheckCanonical
// accepted (so well formed, definite and in bounds): the major type, the
// argument, and the offset after the head.
func cborHead(b []byte, off int) (major byte, arg uint64, next int) {
	ib := b[off]
	major, ai := ib>>5, ib&0x1f
	off++
	if ai < 24 {
		return major, uint64(ai), off
	}
	n := 1 << (ai - 24) // 1, 2, 4 or 8 bytes: CheckCanonical refused the rest
	for _, c := range b[off : off+n] {
		arg = arg<<8 | uint64(c)
	}
	return major, arg, off + n
}

// cborString reads a byte or text string (major) at b[off] and returns its
// contents (not copied; non-nil, if empty) and the offset after it, or nil
// when the item there is of another type.
func cborString(b []byte, off int, major byte) ([]byte, int) {
	if off >= len(b) {
		return nil, off
	}
	mj, n, next := cborHead(b, off)
	if mj != major || n > uint64(len(b)-next) {
		return nil, off
	}
	end := next + int(n)
	return b[next:end:end], end
}

// ParseUnmaskRequest parses the canonical encoding of an UnmaskRequest.
func ParseUnmaskRequest(b []byte) (*UnmaskRequest, error) {
	return parse("unmask request", b, new(UnmaskRequest))
}

// ParseSurvivorSig parses the canonical encoding of a SurvivorSig.
func ParseSurvivorSig(b []byte) (*SurvivorSig, error) {
	return parse("survivor signature", b, new(SurvivorSig))
}

// ParseUnmasking parses the canonical encoding of an Unmasking.
func ParseUnmasking(b []byte) (*Unmasking, error) { return parse("unmasking", b, new(Unmasking)) }
