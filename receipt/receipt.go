// Package receipt is the hash-chained ledger of verified work. Every shard
// the coordinator verifies mints one Receipt naming the job, the shard, the
// canonical result hash, the agreeing peers and the planner's price in work
// units; each receipt carries the hash of the one before it, so editing,
// dropping, duplicating or reordering any receipt breaks the chain.
//
// Invariants: a receipt's Hash is the content hash of its canonical encoding
// without the Hash field; receipt n has Seq n (the first is 1) and Prev equal
// to the Hash of receipt n-1 (Genesis for the first); prices come from the
// planner and nothing else (law 8: elapsed time never enters a price).
package receipt

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Genesis is the Prev of the first receipt of every chain: the hash of the
// fixed string "scellis/receipt/genesis/v1".
var Genesis = content.Hash([]byte("scellis/receipt/genesis/v1"))

// Receipt records one verified shard. All fields but Hash are covered by
// Hash; build receipts with Chain.Next, which fills Seq, Prev and Hash.
type Receipt struct {
	Seq        uint64      `cbor:"seq" json:"seq"`
	Prev       content.Ref `cbor:"prev" json:"prev"`
	Job        content.Ref `cbor:"job" json:"job"`
	Shard      content.Ref `cbor:"shard" json:"shard"`
	ShardIndex int         `cbor:"shard_index" json:"shard_index"`
	// Result is the canonical result hash the agreeing peers reported.
	Result content.Ref `cbor:"result" json:"result"`
	// Peers are the agreeing peers' names, sorted, without duplicates.
	Peers []string `cbor:"peers" json:"peers"`
	// Method names the verification rule, e.g. "quorum-2-exact".
	Method string `cbor:"method" json:"method"`
	// WorkUnits is the planner's price of the shard, fixed before execution.
	WorkUnits int64 `cbor:"work_units" json:"work_units"`
	// PriceBasis says how the planner priced it, e.g. "program cost()".
	PriceBasis string `cbor:"price_basis" json:"price_basis"`
	// LeaderTime is the time (unix ms) carried by the log entry that
	// verified the shard; it never enters the price.
	LeaderTime int64 `cbor:"leader_time" json:"leader_time"`
	// Reverses, when set, makes this a compensating entry: the result of
	// receipt Reverses was later found wrong (a failed re-check), and the
	// credit it gave Peers is taken back. The chain stays append-only:
	// the reversed receipt is never edited. Method is then MethodReversal.
	Reverses uint64 `cbor:"reverses,omitempty" json:"reverses,omitempty"`
	// Tier is the job's reproducibility tier (TierReplayable or
	// TierConvergent) the peers signed; empty on a receipt without
	// signatures (a compensating entry, or a pool that does not sign).
	Tier string `cbor:"tier,omitempty" json:"tier,omitempty"`
	// Signatures are the agreeing peers' signatures of their reports, one
	// per peer in the order of Peers (sign.go).
	Signatures []PeerSignature `cbor:"signatures,omitempty" json:"signatures,omitempty"`
	// Cites are the child chain heads cited by agreeing peers that are
	// child clusters (cite.go), in the order of Peers; empty otherwise.
	Cites []Citation  `cbor:"cites,omitempty" json:"cites,omitempty"`
	Hash  content.Ref `cbor:"hash" json:"hash"`
}

// MethodReversal is the Method of a compensating entry.
const MethodReversal = "reversal"

// body is a Receipt without its Hash: the bytes the Hash covers.
type body struct {
	Seq        uint64          `cbor:"seq"`
	Prev       content.Ref     `cbor:"prev"`
	Job        content.Ref     `cbor:"job"`
	Shard      content.Ref     `cbor:"shard"`
	ShardIndex int             `cbor:"shard_index"`
	Result     content.Ref     `cbor:"result"`
	Peers      []string        `cbor:"peers"`
	Method     string          `cbor:"method"`
	WorkUnits  int64           `cbor:"work_units"`
	PriceBasis string          `cbor:"price_basis"`
	LeaderTime int64           `cbor:"leader_time"`
	Reverses   uint64          `cbor:"reverses,omitempty"`
	Tier       string          `cbor:"tier,omitempty"`
	Signatures []PeerSignature `cbor:"signatures,omitempty"`
	Cites      []Citation      `cbor:"cites,omitempty"`
}

// ComputeHash returns the hash of r's canonical encoding without its Hash
// field. It ignores the stored Hash.
func (r *Receipt) ComputeHash() content.Ref { return hashBody(r) }

// Validate checks r's shape: refs well formed, Seq ≥ 1, a non-negative
// shard index and price, at least one peer, peers sorted and distinct, and
// Hash matching the content. It does not check r's place in a chain.
func (r *Receipt) Validate() error {
	if err := r.validateShape(); err != nil {
		return err
	}
	if h := r.ComputeHash(); h != r.Hash {
		return diag.New(diag.ReceiptMalformed, fmt.Sprintf("receipt %d", r.Seq),
			"content hashes to %s but the receipt says %s", h.Short(), r.Hash.Short())
	}
	return nil
}

// validateShape is Validate without the hash check.
func (r *Receipt) validateShape() error { return r.checkShape(false) }

// checkShape is validateShape; sealed skips the checks of Prev and Hash,
// for a receipt seal has just given them: Hash is then a hash it computed
// and Prev the Hash of a receipt of the chain (or Genesis).
func (r *Receipt) checkShape(sealed bool) error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.ReceiptMalformed, fmt.Sprintf("receipt %d", r.Seq), format, args...)
	}
	if r.Seq == 0 {
		return bad("sequence number 0; the first receipt is 1")
	}
	for _, f := range []struct {
		name string
		ref  content.Ref
		skip bool
	}{{"prev", r.Prev, sealed}, {"job", r.Job, false}, {"shard", r.Shard, false}, {"result", r.Result, false}, {"hash", r.Hash, sealed}} {
		if !f.skip && !content.IsRef(string(f.ref)) {
			return bad("%s %q is not a content ref", f.name, f.ref)
		}
	}
	if r.ShardIndex < 0 {
		return bad("negative shard index %d", r.ShardIndex)
	}
	if r.WorkUnits < 0 {
		return bad("negative price %d work units", r.WorkUnits)
	}
	if len(r.Peers) == 0 {
		return bad("no agreeing peers")
	}
	if r.Reverses >= r.Seq {
		return bad("reverses receipt %d, which does not come before it", r.Reverses)
	}
	if (r.Reverses != 0) != (r.Method == MethodReversal) {
		return bad("method %q with reverses %d: a compensating entry has both, any other neither", r.Method, r.Reverses)
	}
	for i, p := range r.Peers {
		if p == "" {
			return bad("empty peer name")
		}
		if i > 0 && r.Peers[i-1] >= p {
			return bad("peers not sorted and distinct at %q", p)
		}
	}
	if d := r.validateSignatures(); d != "" {
		return bad("%s", d)
	}
	if d := r.validateCites(); d != "" {
		return bad("%s", d)
	}
	return nil
}

// Marshal returns the canonical bytes of r, Hash included.
func (r *Receipt) Marshal() ([]byte, error) { return content.Encode(r) }

// Unmarshal parses one receipt from untrusted bytes. It accepts only the
// canonical encoding of a valid receipt, so Marshal of the result returns b
// exactly.
func Unmarshal(b []byte) (Receipt, error) {
	var r Receipt
	if err := content.Decode(b, &r); err != nil {
		return Receipt{}, diag.New(diag.ReceiptMalformed, "receipt", "cannot decode: %v", err)
	}
	if err := r.Validate(); err != nil {
		return Receipt{}, err
	}
	again, err := r.Marshal()
	if err != nil || !bytes.Equal(again, b) {
		return Receipt{}, diag.New(diag.ReceiptMalformed, fmt.Sprintf("receipt %d", r.Seq),
			"not in canonical encoding (unknown fields, or non-canonical CBOR)")
	}
	return r, nil
}

// Clone returns a deep copy of r.
func (r Receipt) Clone() Receipt {
	r.Peers = slices.Clone(r.Peers)
	if r.Signatures != nil {
		r.Signatures = slices.Clone(r.Signatures)
		for i := range r.Signatures {
			r.Signatures[i].Sig = slices.Clone(r.Signatures[i].Sig)
			r.Signatures[i].Path = slices.Clone(r.Signatures[i].Path)
		}
	}
	if r.Cites != nil {
		r.Cites = slices.Clone(r.Cites)
		for i := range r.Cites {
			r.Cites[i].Sig = slices.Clone(r.Cites[i].Sig)
		}
	}
	return r
}

// validateSignatures checks the shape of r's tier and signatures (not the
// signatures themselves: that needs the federation's keys, see
// VerifySignatures): a known tier, and either no signature or one per
// peer, in the order of Peers, with a result ref, a key in text form and
// a 64-byte signature.
func (r *Receipt) validateSignatures() string {
	switch r.Tier {
	case "", TierReplayable, TierConvergent:
	default:
		return fmt.Sprintf("unknown tier %q", r.Tier)
	}
	if len(r.Signatures) == 0 {
		if r.Signatures != nil {
			return "an empty signature list (leave it out)"
		}
		return ""
	}
	if r.Tier == "" {
		return "signatures without a tier"
	}
	if len(r.Signatures) != len(r.Peers) {
		return fmt.Sprintf("%d signatures for %d peers", len(r.Signatures), len(r.Peers))
	}
	for i, s := range r.Signatures {
		switch {
		case s.Peer != r.Peers[i]:
			return fmt.Sprintf("signature %d is %q's, not %q's: signatures follow Peers", i, s.Peer, r.Peers[i])
		case !content.IsRef(string(s.Result)):
			return fmt.Sprintf("signature of %s: result %q is not a content ref", s.Peer, s.Result)
		case len(s.Sig) != ed25519.SignatureSize:
			return fmt.Sprintf("signature of %s has %d bytes, not %d", s.Peer, len(s.Sig), ed25519.SignatureSize)
		case len(s.Path) > 0 && checkPath(s.Path) != "":
			return fmt.Sprintf("signature of %s: %s", s.Peer, checkPath(s.Path))
		}
		if _, ok := ParseKey(s.Key); !ok {
			return fmt.Sprintf("signature of %s: key %q is not an Ed25519 public key in text form", s.Peer, s.Key)
		}
	}
	return ""
}
