package receipt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"unicode/utf8"

	"github.com/scellis/scellis/content"
)

// The coordinator mints one receipt per verified shard on every replica,
// and hashing its body through the reflective CBOR encoder was most of a
// receipt's cost (issue 19). appendBody writes the same bytes directly:
// the deterministic encoding of body (RFC 8949 §4.2.1, content.Encode),
// with map keys in their fixed canonical order (shorter first, then
// bytewise) and omitempty fields left out when zero. TestBodyEncoding
// checks it against content.Encode, and fails when body gains a field
// this encoder does not write.

// CBOR major types.
const (
	majUint  = 0 << 5
	majNeg   = 1 << 5
	majBytes = 2 << 5
	majText  = 3 << 5
	majArray = 4 << 5
	majMap   = 5 << 5
	cborNull = 0xf6
)

// bodyFields is how many fields body has; the encoder writes each.
const bodyFields = 15

// hashBody returns the content hash of r's body (ComputeHash).
func hashBody(r *Receipt) content.Ref {
	if !bodyIsUTF8(r) {
		// The fast path writes text as is; leave invalid UTF-8 to the
		// reference encoder, whatever it makes of it.
		return hashBodySlow(r)
	}
	var buf [512]byte
	sum := sha256.Sum256(appendBody(buf[:0], r))
	return content.Ref("sha256:" + hex.EncodeToString(sum[:]))
}

func hashBodySlow(r *Receipt) content.Ref {
	b, err := content.Encode(bodyOf(r))
	if err != nil {
		// Only strings, integers, bytes and refs: encoding cannot fail.
		panic("receipt: encoding a receipt body: " + err.Error())
	}
	return content.Hash(b)
}

func bodyOf(r *Receipt) body {
	return body{
		Seq: r.Seq, Prev: r.Prev, Job: r.Job, Shard: r.Shard, ShardIndex: r.ShardIndex,
		Result: r.Result, Peers: r.Peers, Method: r.Method, WorkUnits: r.WorkUnits,
		PriceBasis: r.PriceBasis, LeaderTime: r.LeaderTime, Reverses: r.Reverses,
		Tier: r.Tier, Signatures: r.Signatures, Cites: r.Cites,
	}
}

func bodyIsUTF8(r *Receipt) bool {
	for _, s := range []string{string(r.Prev), string(r.Job), string(r.Shard), string(r.Result), r.Method, r.PriceBasis, r.Tier} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	for _, p := range r.Peers {
		if !utf8.ValidString(p) {
			return false
		}
	}
	for _, s := range r.Signatures {
		if !utf8.ValidString(s.Peer) || !utf8.ValidString(string(s.Result)) || !utf8.ValidString(s.Key) {
			return false
		}
	}
	for _, c := range r.Cites {
		if !utf8.ValidString(c.Peer) || !utf8.ValidString(string(c.Head)) {
			return false
		}
	}
	return true
}

// appendBody appends the canonical CBOR of r's body to dst.
func appendBody(dst []byte, r *Receipt) []byte {
	n := uint64(bodyFields - 4) // reverses, tier, signatures, cites are omitempty
	if len(r.Cites) > 0 {
		n++
	}
	if r.Tier != "" {
		n++
	}
	if r.Reverses != 0 {
		n++
	}
	if len(r.Signatures) > 0 {
		n++
	}
	dst = appendHead(dst, majMap, n)
	dst = appendText(dst, "job")
	dst = appendText(dst, string(r.Job))
	dst = appendText(dst, "seq")
	dst = appendHead(dst, majUint, r.Seq)
	dst = appendText(dst, "prev")
	dst = appendText(dst, string(r.Prev))
	if r.Tier != "" {
		dst = appendText(dst, "tier")
		dst = appendText(dst, r.Tier)
	}
	if len(r.Cites) > 0 {
		dst = appendText(dst, "cites")
		dst = appendHead(dst, majArray, uint64(len(r.Cites)))
		for _, c := range r.Cites {
			// Citation's keys in canonical order: seq, sig, head, peer.
			dst = appendHead(dst, majMap, 4)
			dst = appendText(dst, "seq")
			dst = appendHead(dst, majUint, c.Seq)
			dst = appendText(dst, "sig")
			if c.Sig == nil {
				dst = append(dst, cborNull)
			} else {
				dst = appendHead(dst, majBytes, uint64(len(c.Sig)))
				dst = append(dst, c.Sig...)
			}
			dst = appendText(dst, "head")
			dst = appendText(dst, string(c.Head))
			dst = appendText(dst, "peer")
			dst = appendText(dst, c.Peer)
		}
	}
	dst = appendText(dst, "peers")
	if r.Peers == nil {
		dst = append(dst, cborNull)
	} else {
		dst = appendHead(dst, majArray, uint64(len(r.Peers)))
		for _, p := range r.Peers {
			dst = appendText(dst, p)
		}
	}
	dst = appendText(dst, "shard")
	dst = appendText(dst, string(r.Shard))
	dst = appendText(dst, "method")
	dst = appendText(dst, r.Method)
	dst = appendText(dst, "result")
	dst = appendText(dst, string(r.Result))
	if r.Reverses != 0 {
		dst = appendText(dst, "reverses")
		dst = appendHead(dst, majUint, r.Reverses)
	}
	if len(r.Signatures) > 0 {
		dst = appendText(dst, "signatures")
		dst = appendHead(dst, majArray, uint64(len(r.Signatures)))
		for _, s := range r.Signatures {
			// PeerSignature's keys in canonical order: key, sig, path
			// (omitempty), peer, result.
			fields := uint64(4)
			if len(s.Path) > 0 {
				fields++
			}
			dst = appendHead(dst, majMap, fields)
			dst = appendText(dst, "key")
			dst = appendText(dst, s.Key)
			dst = appendText(dst, "sig")
			if s.Sig == nil {
				dst = append(dst, cborNull)
			} else {
				dst = appendHead(dst, majBytes, uint64(len(s.Sig)))
				dst = append(dst, s.Sig...)
			}
			if len(s.Path) > 0 {
				dst = appendText(dst, "path")
				dst = appendHead(dst, majBytes, uint64(len(s.Path)))
				dst = append(dst, s.Path...)
			}
			dst = appendText(dst, "peer")
			dst = appendText(dst, s.Peer)
			dst = appendText(dst, "result")
			dst = appendText(dst, string(s.Result))
		}
	}
	dst = appendText(dst, "work_units")
	dst = appendInt(dst, r.WorkUnits)
	dst = appendText(dst, "leader_time")
	dst = appendInt(dst, r.LeaderTime)
	dst = appendText(dst, "price_basis")
	dst = appendText(dst, r.PriceBasis)
	dst = appendText(dst, "shard_index")
	dst = appendInt(dst, int64(r.ShardIndex))
	return dst
}

// appendHead appends a CBOR head in its shortest form.
func appendHead(dst []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(dst, major|byte(v))
	case v <= 0xff:
		return append(dst, major|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, major|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, major|26), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, major|27), v)
	}
}

func appendInt(dst []byte, v int64) []byte {
	if v < 0 {
		return appendHead(dst, majNeg, uint64(-(v + 1)))
	}
	return appendHead(dst, majUint, uint64(v))
}

func appendText(dst []byte, s string) []byte {
	return append(appendHead(dst, majText, uint64(len(s))), s...)
}
