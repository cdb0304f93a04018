package receipt

import (
	"errors"
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Reason says how a chain is broken.
type Reason string

const (
	// Edited: the receipt's content does not hash to its Hash.
	Edited Reason = "edited"
	// BrokenLink: the receipt's Prev is not the previous receipt's Hash
	// (one of the two was rewritten and rehashed).
	BrokenLink Reason = "broken-link"
	// Gap: one or more sequence numbers are missing.
	Gap Reason = "gap"
	// Duplicate: a sequence number appears a second time.
	Duplicate Reason = "duplicate"
	// Reordered: the receipt appears before or after its place.
	Reordered Reason = "reordered"
	// Malformed: the receipt's shape is invalid (see Receipt.Validate).
	Malformed Reason = "malformed"
)

// Break is the first place a chain fails verification. It unwraps to a
// diag.Diagnostic (code SC7013) for rendering.
type Break struct {
	Index  int    // position in the verified slice
	Seq    uint64 // the Seq the receipt there carries
	Reason Reason
	Detail string
}

func (b *Break) Error() string {
	return fmt.Sprintf("receipt chain broken at index %d (seq %d): %s: %s", b.Index, b.Seq, b.Reason, b.Detail)
}

// Diagnostic renders b for people.
func (b *Break) Diagnostic() *diag.Diagnostic {
	return diag.New(diag.ReceiptChainBroken, fmt.Sprintf("receipt %d", b.Seq),
		"chain broken at index %d: %s: %s", b.Index, b.Reason, b.Detail).
		WithHelp("the chain was altered after it was written; compare it with another aggregator node's copy")
}

// Unwrap lets diag.As find the diagnostic.
func (b *Break) Unwrap() error { return b.Diagnostic() }

// Verify checks that rs is a whole chain from Genesis: receipt i has Seq
// i+1, links to receipt i-1 (Genesis for the first), hashes to its Hash and
// is well formed. It returns nil or a *Break naming the first bad index.
func Verify(rs []Receipt) error { return VerifyFrom(0, Genesis, rs) }

// VerifyFrom checks that rs continues a chain whose head is (seq, hash),
// e.g. a page of receipts fetched with Since(seq).
func VerifyFrom(seq uint64, hash content.Ref, rs []Receipt) error {
	want, prev := seq+1, hash
	seen := make(map[uint64]bool, len(rs))
	for i := range rs {
		r := &rs[i]
		brk := func(reason Reason, format string, args ...any) error {
			return &Break{Index: i, Seq: r.Seq, Reason: reason, Detail: fmt.Sprintf(format, args...)}
		}
		if h := r.ComputeHash(); h != r.Hash {
			return brk(Edited, "content hashes to %s but the receipt says %s", h.Short(), r.Hash.Short())
		}
		switch {
		case r.Seq < want && seen[r.Seq]:
			return brk(Duplicate, "sequence %d appears again", r.Seq)
		case r.Seq < want:
			return brk(Reordered, "sequence %d found where %d belongs", r.Seq, want)
		case r.Seq > want && laterHas(rs[i+1:], want):
			return brk(Reordered, "sequence %d found where %d belongs; %d comes later", r.Seq, want, want)
		case r.Seq > want:
			return brk(Gap, "sequence %d follows %d", r.Seq, want-1)
		case r.Prev != prev:
			return brk(BrokenLink, "prev %s is not the hash %s of the receipt before", r.Prev.Short(), prev.Short())
		}
		if err := r.Validate(); err != nil {
			var d *diag.Diagnostic
			if errors.As(err, &d) {
				return brk(Malformed, "%s", d.Message)
			}
			return brk(Malformed, "%v", err)
		}
		seen[r.Seq] = true
		want, prev = want+1, r.Hash
	}
	return nil
}

func laterHas(rs []Receipt, seq uint64) bool {
	for i := range rs {
		if rs[i].Seq == seq {
			return true
		}
	}
	return false
}
