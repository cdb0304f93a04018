package silo

import (
	"crypto/ed25519"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
)

// ContributionFormat versions Contribution.
const ContributionFormat = "scellis/contribution/v1"

// Contribution statuses.
const (
	// Contributed: the silo charged its ledger (when DP is on) and took
	// part in the round's secure aggregation.
	Contributed = "contributed"
	// Declined: the silo refused the round before doing anything (its
	// policy, its ledger, or a malformed round); nothing was charged.
	Declined = "declined"
	// Failed: the silo's secure aggregation did not complete. When the
	// record names a ledger entry the silo was charged for its update and
	// the charge stands (law 6); when it names none, the round's secure
	// aggregation failed, or the silo could not cache its release, before
	// the charge, and nothing was charged or sent but its keys.
	Failed = "failed"
)

// Contribution is what a silo reports for its shard of a round job: the
// record the round's receipt cites. It holds hashes and parameters only,
// never the update or the metrics.
type Contribution struct {
	Format  string      `cbor:"format" json:"format"`
	Run     content.Ref `cbor:"run" json:"run"`
	Round   int         `cbor:"round" json:"round"`
	Job     content.Ref `cbor:"job" json:"job"`
	Shard   int         `cbor:"shard" json:"shard"`
	Silo    string      `cbor:"silo" json:"silo"`
	Dataset string      `cbor:"dataset" json:"dataset"`
	// Label is the label column the silo's dataset declaration names (a
	// column name of its schema, never a value): a run whose spec names
	// none gets its model file's label from its silos' records.
	Label  string `cbor:"label,omitempty" json:"label,omitempty"`
	Status string `cbor:"status" json:"status"`
	// LedgerEntry is the hash of the ledger entry that paid for the
	// update ("" when nothing was charged: no DP, or declined).
	LedgerEntry content.Ref    `cbor:"ledger_entry,omitempty" json:"ledger_entry,omitempty"`
	Mechanisms  []dp.Mechanism `cbor:"mechanisms,omitempty" json:"mechanisms,omitempty"`
	Epsilon     float64        `cbor:"epsilon,omitempty" json:"epsilon,omitempty"` // the charge alone, at the dataset's δ
	SecAggRound string         `cbor:"secagg_round" json:"secagg_round"`
	// LedgerSeq and LedgerHead are the sequence number and hash of the
	// last entry of the silo's ledger when the record was signed (the
	// charge itself, or a later entry). The receipt chain cites the record,
	// so it anchors the ledger's head: whoever holds the chain can tell a
	// truncated or rolled-back ledger (scellis ledger audit).
	LedgerSeq  uint64      `cbor:"ledger_seq,omitempty" json:"ledger_seq,omitempty"`
	LedgerHead content.Ref `cbor:"ledger_head,omitempty" json:"ledger_head,omitempty"`
	// Delta, Cumulative and Budget are the dataset's δ, its cumulative ε
	// in the ledger (every charge so far, composed in RDP) and its ε budget
	// when the record was signed: bookkeeping for the privacy report, none
	// of it depends on the dataset's records.
	Delta      float64 `cbor:"delta,omitempty" json:"delta,omitempty"`
	Cumulative float64 `cbor:"cumulative_epsilon,omitempty" json:"cumulative_epsilon,omitempty"`
	Budget     float64 `cbor:"budget_epsilon,omitempty" json:"budget_epsilon,omitempty"`
	// Refusals are the reasons of a declined or failed round.
	Refusals []Refusal `cbor:"refusals,omitempty" json:"refusals,omitempty"`
}

// Refusal is one reason of a declined or failed round, as every member
// reads it: a diagnostic code and the fixed title of that code, never the
// diagnostic's own text. A model or content error's message may quote a
// record value or a row number (law 11: declines carry codes, never
// content); the full diagnostic stays in the silo's own log.
type Refusal struct {
	Code    diag.Code `cbor:"code" json:"code"`
	Message string    `cbor:"message" json:"message"` // diag.Title(Code)
}

// SignedContribution is a Contribution signed by the silo's identity key
// (identity.PurposeContribution over its canonical encoding).
type SignedContribution struct {
	Record Contribution `cbor:"record" json:"record"`
	Key    []byte       `cbor:"key" json:"key"` // the signer's Ed25519 public key
	Sig    []byte       `cbor:"sig" json:"sig"`
}

// Sign signs c with id.
func Sign(id *identity.Identity, c Contribution) (*SignedContribution, error) {
	sig, err := identity.SignValue(id, identity.PurposeContribution, c)
	if err != nil {
		return nil, err
	}
	pub := id.Public().Ed25519()
	return &SignedContribution{Record: c, Key: append([]byte(nil), pub...), Sig: sig}, nil
}

// Verify checks the signature and that the signer is the federation's
// member named in the record.
func (s *SignedContribution) Verify(fed *identity.Federation) error {
	m, ok := fed.Member(s.Record.Silo)
	if !ok {
		return fmt.Errorf("silo: contribution of %q, which is not a federation member", s.Record.Silo)
	}
	if len(s.Key) != ed25519.PublicKeySize || !ed25519.PublicKey(s.Key).Equal(m.PublicKey.Ed25519()) {
		return fmt.Errorf("silo: contribution of %q is not signed with its key", s.Record.Silo)
	}
	if !identity.VerifyValue(m.PublicKey, identity.PurposeContribution, s.Record, s.Sig) {
		return fmt.Errorf("silo: the signature of %q's contribution does not verify", s.Record.Silo)
	}
	return nil
}

// DecodeContribution parses a signed contribution blob.
func DecodeContribution(b []byte) (*SignedContribution, error) {
	var s SignedContribution
	if err := content.Decode(b, &s); err != nil {
		return nil, fmt.Errorf("silo: decoding a contribution: %w", err)
	}
	if s.Record.Format != ContributionFormat {
		return nil, fmt.Errorf("silo: contribution format %q, want %q", s.Record.Format, ContributionFormat)
	}
	return &s, nil
}

// refusalsOf reduces err to the codes of its diagnostics, each once, with
// the fixed title of each code; an error that is no diagnostic becomes
// diag.SiloRoundFailed.
func refusalsOf(err error) []Refusal {
	var codes []diag.Code
	if ds, ok := diag.As(err); ok {
		for _, d := range ds {
			if !slices.Contains(codes, d.Code) {
				codes = append(codes, d.Code)
			}
		}
	}
	if len(codes) == 0 {
		codes = []diag.Code{diag.SiloRoundFailed}
	}
	out := make([]Refusal, len(codes))
	for i, c := range codes {
		out[i] = Refusal{Code: c, Message: diag.Title(c)}
	}
	return out
}
