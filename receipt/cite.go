package receipt

import (
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Citations (a tree of coordinator clusters, docs/tree.md): a child
// cluster that computed a parent job's shards reports their results upward
// under its delegate identity, a member of the parent's federation with
// the role cluster. Each report cites the child chain's head at the time:
// its sequence number and hash, signed with the delegate key. The parent's
// receipt keeps the citations of its agreeing peers (Receipt.Cites), so a
// verifier can fetch the child's chain, check it up to that head, and find
// in it the child's own receipt of the same shard and result.

// PurposeCite is the Ed25519ctx context of a citation's signature: the
// value of identity.PurposeCite.
const PurposeCite = "scellis/cite/v1"

// Citation is a child cluster's chain head, cited by the receipt of a
// shard the child computed.
type Citation struct {
	// Peer is the child cluster's member name in the parent federation:
	// one of the receipt's Peers.
	Peer string `cbor:"peer" json:"peer"`
	// Seq and Head are the child chain's length and last hash when the
	// child reported.
	Seq  uint64      `cbor:"seq" json:"seq"`
	Head content.Ref `cbor:"head" json:"head"`
	// Sig is the delegate key's signature of CitationBytes, made with the
	// key that signed the peer's result (the receipt's Signatures).
	Sig []byte `cbor:"sig" json:"sig"`
}

// citationBody is what a citation's signature covers.
type citationBody struct {
	Peer string      `cbor:"peer"`
	Seq  uint64      `cbor:"seq"`
	Head content.Ref `cbor:"head"`
}

// CitationBytes returns the message a child cluster signs to cite its
// head: the canonical CBOR of {peer, seq, head}.
func CitationBytes(peer string, seq uint64, head content.Ref) []byte {
	b, err := content.Encode(citationBody{Peer: peer, Seq: seq, Head: head})
	if err != nil {
		panic("receipt: encoding a citation: " + err.Error())
	}
	return b
}

// Verify reports whether c's signature verifies under key (text form).
func (c Citation) Verify(key string) bool {
	return VerifySigned(key, PurposeCite, CitationBytes(c.Peer, c.Seq, c.Head), c.Sig)
}

// validateCites checks the shape of r's citations: each names a distinct
// peer of the receipt, in the order of Peers, with a head ref, a sequence
// number and a 64-byte signature.
func (r *Receipt) validateCites() string {
	if r.Cites == nil {
		return ""
	}
	if len(r.Cites) == 0 {
		return "an empty citation list (leave it out)"
	}
	next := 0
	for i, c := range r.Cites {
		for next < len(r.Peers) && r.Peers[next] != c.Peer {
			next++
		}
		switch {
		case next == len(r.Peers):
			return fmt.Sprintf("citation %d names %q, not a peer of the receipt after the previous citation's", i, c.Peer)
		case c.Seq == 0 || !content.IsRef(string(c.Head)):
			return fmt.Sprintf("citation of %s: sequence %d, head %q: a cited head is a receipt of the child's chain", c.Peer, c.Seq, c.Head)
		case len(c.Sig) != 64:
			return fmt.Sprintf("citation of %s: signature of %d bytes, not 64", c.Peer, len(c.Sig))
		}
		next++
	}
	return ""
}

// VerifyCites checks every citation's signature with the key the receipt's
// signature of the same peer was made with (VerifySignatures checks that
// key against the federation). The error is SC7306 naming the peer.
func (r *Receipt) VerifyCites() error {
	for _, c := range r.Cites {
		key := ""
		for _, s := range r.Signatures {
			if s.Peer == c.Peer {
				key = s.Key
			}
		}
		if key == "" || !c.Verify(key) {
			return diag.New(diag.ReceiptUnsigned, fmt.Sprintf("receipt %d", r.Seq), "the citation of %s's chain head %d (%s) is not signed by %s's key", c.Peer, c.Seq, c.Head.Short(), c.Peer).
				WithHelp("the receipt export was altered, or the child cluster's delegate key is not the one its parent federation lists")
		}
	}
	return nil
}
