package receipt

import (
	"fmt"
	"slices"
	"sort"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Chain is an append-only sequence of receipts, each linked to the one
// before. The zero value is an empty chain whose head is (0, Genesis).
// A Chain is not safe for concurrent use.
type Chain struct {
	receipts []Receipt
}

// NewChain returns a chain holding rs after checking that they form a valid
// chain from Genesis (see Verify).
func NewChain(rs []Receipt) (*Chain, error) {
	if err := Verify(rs); err != nil {
		return nil, err
	}
	c := &Chain{receipts: make([]Receipt, len(rs))}
	for i, r := range rs {
		c.receipts[i] = r.Clone()
	}
	return c, nil
}

// Head returns the sequence number and hash of the last receipt, or
// (0, Genesis) for an empty chain.
func (c *Chain) Head() (seq uint64, hash content.Ref) {
	if len(c.receipts) == 0 {
		return 0, Genesis
	}
	last := &c.receipts[len(c.receipts)-1]
	return last.Seq, last.Hash
}

// Len is the number of receipts.
func (c *Chain) Len() int { return len(c.receipts) }

// Next seals r as the next receipt of c: it sets Seq, Prev and Hash (and
// sorts Peers) without appending. Pass the result to Append.
func (c *Chain) Next(r Receipt) Receipt {
	r = r.Clone()
	seq, prev := c.Head()
	seal(&r, seq, prev)
	return r
}

// seal sorts r's peers and signatures and sets Seq, Prev and Hash to follow
// a head (seq, prev).
func seal(r *Receipt, seq uint64, prev content.Ref) {
	sort.Strings(r.Peers)
	r.Peers = slices.Compact(r.Peers)
	sort.SliceStable(r.Signatures, func(a, b int) bool { return r.Signatures[a].Peer < r.Signatures[b].Peer })
	r.Seq, r.Prev = seq+1, prev
	r.Hash = r.ComputeHash()
}

// AppendSealed is Append for a receipt Next has just sealed on c: the
// same checks, except that the hash Next computed is not computed again
// (the coordinator mints one receipt per verified shard on every replica,
// and the second hash was a third of its cost). Anything else must go
// through Append.
func (c *Chain) AppendSealed(r Receipt) error {
	return c.appendChecked(r, r.validateShape)
}

// Mint seals r as the receipt after last (nil: the first of a chain) — the
// sealing of Next and the checks of AppendSealed, for a caller that keeps
// its chain in a slice of its own. last must be a receipt of that chain
// (minted, or checked by Verify): its Hash becomes r's Prev unchecked. The coordinator keeps its receipts in
// its replicated state, and keeping them a second time in a Chain (and
// copying each receipt three times to do so) was a tenth of the cost of a
// report that mints one (issue 19). r's slices are copied once; the
// returned receipt owns its slices, and the caller must not change them
// (receipts are never edited: a reversal is a new receipt).
func Mint(last *Receipt, r Receipt) (Receipt, error) {
	r = r.Clone()
	seq, prev := uint64(0), Genesis
	if last != nil {
		seq, prev = last.Seq, last.Hash
	}
	seal(&r, seq, prev)
	if err := r.checkShape(true); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// Append adds r after checking that it is valid, that its Seq is one past
// the head's and that its Prev is the head's hash. On error c is unchanged.
func (c *Chain) Append(r Receipt) error {
	return c.appendChecked(r, r.Validate)
}

func (c *Chain) appendChecked(r Receipt, validate func() error) error {
	seq, head := c.Head()
	if r.Seq != seq+1 {
		return diag.New(diag.ReceiptChainBroken, fmt.Sprintf("receipt %d", r.Seq),
			"sequence %d does not follow the head %d", r.Seq, seq)
	}
	if r.Prev != head {
		return diag.New(diag.ReceiptChainBroken, fmt.Sprintf("receipt %d", r.Seq),
			"prev %s is not the head's hash %s", r.Prev.Short(), head.Short())
	}
	if err := validate(); err != nil {
		return err
	}
	c.receipts = append(c.receipts, r.Clone())
	return nil
}

// All returns a copy of every receipt in order.
func (c *Chain) All() []Receipt { return c.Since(0) }

// Since returns a copy of the receipts with Seq > seq, in order.
func (c *Chain) Since(seq uint64) []Receipt {
	if seq >= uint64(len(c.receipts)) {
		return []Receipt{}
	}
	out := make([]Receipt, 0, uint64(len(c.receipts))-seq)
	for _, r := range c.receipts[seq:] {
		out = append(out, r.Clone())
	}
	return out
}
