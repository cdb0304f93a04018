package silo

import (
	"crypto/ed25519"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// Audit is what AuditLedger found: every contribution of the ledger's silo
// that the receipt chain cites, and each disagreement with the ledger.
type Audit struct {
	Silo          string        `json:"silo"`
	Entries       int           `json:"ledger_entries"`
	Head          content.Ref   `json:"ledger_head"`
	Receipts      int           `json:"receipts"`
	Contributions int           `json:"contributions"`
	Anchors       []AuditAnchor `json:"anchors"`
	// Unavailable are receipts of the silo whose cited record could not be
	// fetched: not evidence against the ledger, but not checked either.
	Unavailable []uint64 `json:"unavailable,omitempty"`
	// Highest is the highest ledger sequence number the chain anchors.
	Highest uint64 `json:"highest_anchored_seq"`
}

// AuditAnchor is one ledger entry a receipt-cited contribution names.
type AuditAnchor struct {
	Receipt uint64      `json:"receipt"`
	Run     content.Ref `json:"run"`
	Round   int         `json:"round"`
	Kind    string      `json:"kind"` // "charge" or "head"
	Seq     uint64      `json:"seq"`
	Entry   content.Ref `json:"entry"`
	Problem string      `json:"problem,omitempty"`
}

// Problems returns the anchors the ledger disagrees with.
func (a *Audit) Problems() []AuditAnchor {
	var out []AuditAnchor
	for _, x := range a.Anchors {
		if x.Problem != "" {
			out = append(out, x)
		}
	}
	return out
}

// AuditLedger checks a verified ledger against a receipt chain. The chain
// must verify (receipt.Verify); fetch returns the bytes of a receipt's
// result blob (they are re-hashed here). Every result that is a
// contribution of silo signed with the ledger's key is checked: the charge
// it names (LedgerEntry) must be in the ledger as the charge of that run's
// round, with the same dataset, mechanisms and ε, and the head it names
// (LedgerSeq, LedgerHead) must be the ledger's entry at that sequence
// number. A ledger that was truncated, rolled back to a copy, or replaced
// fails; one that only grew since passes.
func AuditLedger(snap *dp.Snapshot, silo string, rs []receipt.Receipt, fetch func(content.Ref) ([]byte, error)) (*Audit, error) {
	if err := receipt.Verify(rs); err != nil {
		return nil, err
	}
	entries := snap.Entries()
	a := &Audit{Silo: silo, Entries: len(entries), Head: snap.Head(), Receipts: len(rs)}
	pub := snap.PublicKey()
	for _, r := range rs {
		if !slices.Contains(r.Peers, silo) {
			continue
		}
		b, err := fetch(r.Result)
		if err != nil || content.Hash(b) != r.Result {
			a.Unavailable = append(a.Unavailable, r.Seq)
			continue
		}
		sc, err := DecodeContribution(b)
		if err != nil {
			continue // a generic shard's result, not a contribution
		}
		rec := sc.Record
		if rec.Silo != silo || !verifyContribution(sc.Key, sc) {
			continue
		}
		a.Contributions++
		if !ed25519.PublicKey(sc.Key).Equal(pub) {
			// The silo signs its records and its ledger with one key: a
			// ledger under another key is not the silo's ledger.
			a.add(AuditAnchor{Receipt: r.Seq, Run: rec.Run, Round: rec.Round, Kind: "key",
				Problem: fmt.Sprintf("the silo's record of run %s round %d is signed by %s, the ledger by %s: this is not the silo's ledger", rec.Run.Short(), rec.Round, dp.PublicKeyString(sc.Key), dp.PublicKeyString(pub))})
			continue
		}
		if rec.LedgerEntry != "" {
			x := AuditAnchor{Receipt: r.Seq, Run: rec.Run, Round: rec.Round, Kind: "charge", Entry: rec.LedgerEntry}
			e, ok := snap.Find(rec.LedgerEntry)
			switch {
			case !ok:
				x.Problem = fmt.Sprintf("the charge %s for run %s round %d is not in the ledger: it was truncated, rolled back or replaced", rec.LedgerEntry.Short(), rec.Run.Short(), rec.Round)
			case e.Charge == nil || e.Charge.Consumer != Consumer(string(rec.Run), rec.Round) || e.Charge.Dataset != rec.Dataset ||
				e.Charge.Epsilon != rec.Epsilon || !slices.Equal(e.Charge.Mechanisms, rec.Mechanisms):
				x.Seq = e.Seq
				x.Problem = fmt.Sprintf("ledger entry %d is not the charge the record of run %s round %d describes", e.Seq, rec.Run.Short(), rec.Round)
			default:
				x.Seq = e.Seq
			}
			a.add(x)
		}
		if rec.LedgerHead != "" {
			x := AuditAnchor{Receipt: r.Seq, Run: rec.Run, Round: rec.Round, Kind: "head", Seq: rec.LedgerSeq, Entry: rec.LedgerHead}
			switch {
			case rec.LedgerSeq >= uint64(len(entries)):
				x.Problem = fmt.Sprintf("the chain anchors entry %d (%s), but the ledger has %d entries: it was truncated or rolled back", rec.LedgerSeq, rec.LedgerHead.Short(), len(entries))
			case entries[rec.LedgerSeq].Hash != rec.LedgerHead:
				x.Problem = fmt.Sprintf("the chain anchors entry %d as %s, but the ledger's entry %d is %s: it was rolled back and rewritten, or replaced", rec.LedgerSeq, rec.LedgerHead.Short(), rec.LedgerSeq, entries[rec.LedgerSeq].Hash.Short())
			}
			a.add(x)
		}
	}
	return a, nil
}

func (a *Audit) add(x AuditAnchor) {
	a.Anchors = append(a.Anchors, x)
	if x.Seq > a.Highest {
		a.Highest = x.Seq
	}
}

func verifyContribution(pub []byte, sc *SignedContribution) bool {
	var k identity.PublicKey
	if len(pub) != len(k) {
		return false
	}
	copy(k[:], pub)
	return identity.VerifyValue(k, identity.PurposeContribution, sc.Record, sc.Sig)
}
