package identity

import (
	"crypto/ed25519"
	"fmt"

	"github.com/scellis/scellis/content"
)

// Purpose separates signatures by what they are for, so a signature made
// for one purpose never verifies for another. It is used as the Ed25519ctx
// context (RFC 8032 §5.1): 1 to 255 bytes, by convention
// "scellis/<what>/v<version>". Because Ed25519ctx signs under its own
// domain prefix, these signatures also never collide with the pure Ed25519
// signatures the same key makes in TLS handshakes and certificates.
//
// Define every purpose here, so that no two packages pick the same string.
// A package that cannot import identity (receipt, volunteer/proof) may
// repeat one as an untyped constant named Purpose…; TestPurposesDistinct
// holds every such constant in the repository to a value listed here, and
// the values here distinct.
type Purpose string

const (
	// PurposeReceipt signs a receipt of the hash-chained receipt ledger.
	PurposeReceipt Purpose = "scellis/receipt/v1"
	// PurposeResult signs a peer's shard result (its hash and metadata).
	PurposeResult Purpose = "scellis/result/v1"
	// PurposeResultBatch signs the Merkle root of a batch of a peer's
	// shard results (receipt.PurposeResultBatch, receipt/batch.go).
	PurposeResultBatch Purpose = "scellis/result-batch/v1"
	// PurposeLedgerEntry signs a privacy-ledger entry of a silo.
	PurposeLedgerEntry Purpose = "scellis/ledger-entry/v1"
	// PurposeSecaggAdvert signs a secure-aggregation key advertisement.
	PurposeSecaggAdvert Purpose = "scellis/secagg-advert/v1"
	// PurposeSecaggSurvivors signs a secure-aggregation survivor set: a
	// site's statement, in the consistency round, of which sites it was
	// told sent their masked input (and which dropped out).
	PurposeSecaggSurvivors Purpose = "scellis/secagg-survivors/v1"
	// PurposeHEAdvert signs a threshold-he round's key advert and
	// public-key share (package secagg/he).
	PurposeHEAdvert Purpose = "scellis/he-advert/v1"
	// PurposeContribution signs a silo's contribution record for one round
	// of a training run (what it charged, and whether it took part).
	PurposeContribution Purpose = "scellis/contribution/v1"
	// PurposeP2PFingerprint signs the DTLS certificate fingerprint a peer
	// offers in a data-plane connection's signalling (dataplane/), so the
	// aggregator relaying the signalling cannot substitute its own.
	PurposeP2PFingerprint Purpose = "scellis/p2p-fingerprint/v1"
	// PurposeMembership signs a membership change (add, revoke, rotate)
	// by an operator.
	PurposeMembership Purpose = "scellis/membership-change/v1"
	// PurposeViewerToken signs a Studio viewer token: a member's claim to
	// watch the live web view until the token expires.
	PurposeViewerToken Purpose = "scellis/studio-viewer/v1"
	// PurposeVerdict signs a verifier peer's verdict on a checked shard
	// (coordinator.ReportVerdict without its time and signature).
	PurposeVerdict Purpose = "scellis/verdict/v1"
	// PurposeVolunteerJoin signs a browser volunteer's join message (its
	// ephemeral key, over the node's challenge): volunteer/proof declares
	// the same value as proof.PurposeJoin, because the WebAssembly worker
	// links that package and not this one (a test holds them equal).
	PurposeVolunteerJoin Purpose = "scellis/volunteer-join/v1"
	// PurposeCite signs a child cluster's citation of its receipt chain
	// head in a report to its parent cluster (receipt.PurposeCite).
	PurposeCite Purpose = "scellis/cite/v1"
	// PurposeModelFile signs a model file an aggregator node assembled
	// from its replica of a run (fl.ModelFile's attestation).
	PurposeModelFile Purpose = "scellis/model-file/v1"
	// PurposeRoundCheck signs an aggregator node's digest of a training
	// round's outcome, computed by itself (fl.CheckStatement): the
	// cross-checked reduction.
	PurposeRoundCheck Purpose = "scellis/round-check/v1"
)

func (p Purpose) valid() bool { return len(p) > 0 && len(p) <= 255 }

// Sign signs msg for purpose p. It panics when p is empty or longer than 255
// bytes: purposes are constants, and a bad one is a programming error.
func Sign(id *Identity, p Purpose, msg []byte) []byte {
	if !p.valid() {
		panic("identity: invalid signing purpose: must be 1 to 255 bytes")
	}
	sig, err := id.PrivateKey().Sign(nil, msg, &ed25519.Options{Context: string(p)})
	if err != nil {
		panic("identity: Ed25519ctx signing failed: " + err.Error())
	}
	return sig
}

// Verify reports whether sig is pub's signature of msg for purpose p.
func Verify(pub PublicKey, p Purpose, msg, sig []byte) bool {
	if !p.valid() || len(sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.VerifyWithOptions(pub[:], msg, sig, &ed25519.Options{Context: string(p)}) == nil
}

// SignValue signs the canonical encoding (content.Encode) of v for purpose p.
func SignValue(id *Identity, p Purpose, v any) ([]byte, error) {
	b, err := content.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("identity: encoding the value to sign: %w", err)
	}
	return Sign(id, p, b), nil
}

// VerifyValue reports whether sig is pub's signature of the canonical
// encoding of v for purpose p. A value that cannot be encoded never verifies.
func VerifyValue(pub PublicKey, p Purpose, v any, sig []byte) bool {
	b, err := content.Encode(v)
	if err != nil {
		return false
	}
	return Verify(pub, p, b, sig)
}
