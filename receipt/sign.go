package receipt

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Peer signatures (item 7 of the verification regime): each peer that
// reports a result signs a Statement binding the job, the shard, its result
// hash and the job's reproducibility tier with its federation identity key
// (Ed25519ctx, context PurposeResult). The coordinator checks the signature
// when it applies the report and copies the agreeing peers' signatures into
// the receipt it mints, so anyone holding the receipt export and the
// federation file can check, offline, that every credited peer vouched for
// the result (Receipt.VerifySignatures).
//
// The check lives here rather than in package identity because the
// coordinator may import receipt but nothing that parses federation files;
// the key text form and the purpose string are identity's (a test holds
// them equal).

// PurposeResult is the Ed25519ctx context of a Statement signature: the
// value of identity.PurposeResult.
const PurposeResult = "scellis/result/v1"

// Tiers a Statement names.
const (
	TierReplayable = "replayable"
	TierConvergent = "convergent"
)

// Statement is what a peer signs about its result for one shard.
type Statement struct {
	Job    content.Ref `cbor:"job"`
	Shard  int         `cbor:"shard"`
	Result content.Ref `cbor:"result"`
	Tier   string      `cbor:"tier"`
	Peer   string      `cbor:"peer"`
}

// Bytes returns the canonical encoding of s: the signed message.
func (s Statement) Bytes() []byte {
	b, err := content.Encode(s)
	if err != nil {
		// Strings, an integer and refs only.
		panic("receipt: encoding a result statement: " + err.Error())
	}
	return b
}

// PeerSignature is one agreeing peer's signature of its Statement, kept in
// a receipt. Result is the hash the peer reported: the receipt's Result in
// the replayable tier, possibly another hash within the tolerance in the
// convergent tier. Key is the public key that signed, in identity's text
// form ("ed25519:" and base64).
type PeerSignature struct {
	Peer   string      `cbor:"peer" json:"peer"`
	Result content.Ref `cbor:"result" json:"result"`
	Key    string      `cbor:"key" json:"key"`
	Sig    []byte      `cbor:"sig" json:"sig"`
	// Path, when set, says Sig is the peer's signature of a batch of
	// statements (batch.go): the path from this statement's leaf to the
	// batch's Merkle root, which Sig signs under PurposeResultBatch.
	// Empty for a statement signed alone.
	Path []byte `cbor:"path,omitempty" json:"path,omitempty"`
}

// KeyPrefix starts the text form of a public key (identity.PublicKeyPrefix).
const KeyPrefix = "ed25519:"

// ParseKey decodes a public key from its text form, or reports false.
func ParseKey(s string) (ed25519.PublicKey, bool) {
	rest, ok := strings.CutPrefix(s, KeyPrefix)
	if !ok {
		return nil, false
	}
	b, err := base64.StdEncoding.Strict().DecodeString(rest)
	if err != nil || len(b) != ed25519.PublicKeySize || KeyPrefix+base64.StdEncoding.EncodeToString(b) != s {
		return nil, false
	}
	return ed25519.PublicKey(b), true
}

// VerifyStatement reports whether sig is key's signature of s (key in text
// form). A malformed key or signature never verifies.
func VerifyStatement(key string, s Statement, sig []byte) bool {
	return VerifySigned(key, PurposeResult, s.Bytes(), sig)
}

// VerifySigned reports whether sig is key's Ed25519ctx signature of msg
// under context purpose (key in text form).
func VerifySigned(key, purpose string, msg, sig []byte) bool {
	pub, ok := ParseKey(key)
	if !ok || len(sig) != ed25519.SignatureSize || purpose == "" || len(purpose) > 255 {
		return false
	}
	return ed25519.VerifyWithOptions(pub, msg, sig, &ed25519.Options{Context: purpose}) == nil
}

// VerifySignatures checks that every peer r credits signed its result:
// r carries one signature per peer, each verifying under the key keyOf
// gives for that peer (the federation file's; constant-time key
// comparison is not needed, keys are public). A compensating entry
// credits nobody and carries none. The error is an SC7306 diagnostic
// naming the first peer whose signature is missing, made by another key,
// or invalid.
func (r *Receipt) VerifySignatures(keyOf func(peer string) (string, bool)) error {
	bad := func(peer, format string, args ...any) error {
		return diag.New(diag.ReceiptUnsigned, fmt.Sprintf("receipt %d", r.Seq), "peer %s: %s", peer, fmt.Sprintf(format, args...)).
			WithHelp("the receipt credits a peer that did not sign the result; the export was altered, or it comes from a pool that does not sign reports")
	}
	if r.Reverses != 0 {
		if len(r.Signatures) != 0 {
			return bad(r.Peers[0], "a compensating entry carries signatures")
		}
		return nil
	}
	for i, p := range r.Peers {
		if i >= len(r.Signatures) || r.Signatures[i].Peer != p {
			return bad(p, "no signature")
		}
		s := r.Signatures[i]
		want, ok := keyOf(p)
		if !ok && VolunteerKey(p, s.Key) {
			// A volunteer's name is derived from its key (volunteer.go).
			want, ok = s.Key, true
		}
		switch {
		case !ok && IsVolunteer(p):
			return bad(p, "signed with key %s, which this volunteer's name was not derived from", s.Key)
		case !ok:
			return bad(p, "not a member of the federation")
		case s.Key != want:
			return bad(p, "signed with key %s, but the federation lists %s", s.Key, want)
		case r.Tier == TierReplayable && s.Result != r.Result:
			return bad(p, "signed result %s, not the receipt's %s (the replayable tier is byte-exact)", s.Result.Short(), r.Result.Short())
		case !VerifyStatementIn(s.Key, Statement{Job: r.Job, Shard: r.ShardIndex, Result: s.Result, Tier: r.Tier, Peer: p}, s.Sig, s.Path):
			return bad(p, "the signature does not verify for job %s shard %d result %s tier %s", r.Job.Short(), r.ShardIndex, s.Result.Short(), r.Tier)
		}
	}
	if len(r.Signatures) > len(r.Peers) {
		return bad(r.Signatures[len(r.Peers)].Peer, "a signature for a peer the receipt does not credit")
	}
	return nil
}
