package coordinator

import (
	"encoding/binary"
	"math"
	"unicode/utf8"

	"github.com/scellis/scellis/content"
)

// Every replica decodes every command it applies, and a result report is
// the command the pool sends most: one per shard and replica. Through the
// reflective CBOR decoder, plus the re-encoding that proves the input
// canonical, decoding a report cost more than applying it (issue 19:
// about 40 % of a report's apply time, a batch of reports included).
//
// decodeFast reads the two shapes reports travel in — a report envelope
// {"report": {...}} and a batch of them {"batch": [{"report": {...}}, ...]}
// — directly. It runs only on bytes content.CheckCanonical accepted
// (shortest heads, definite lengths, map keys strictly increasing), and it
// accepts only the exact shape EncodeCommand writes: every field without
// omitempty present, every omitempty field present only when not zero,
// every value of its field's CBOR type, text valid UTF-8, refs well formed,
// integers within int64. So what it accepts, the general path accepts too,
// as the same command, and re-encodes to the same bytes — there is nothing
// left to re-encode. Anything else (another command, a null, an empty
// batch, an unknown field, a malformed ref) is left to the general path,
// which decodes it or refuses it with its usual diagnostic.
// FuzzDecodeFast checks the agreement.

// decodeFast decodes b, which passed content.CheckCanonical, when it is a
// report or a non-empty batch of reports; ok is false otherwise.
func decodeFast(b []byte) (c Command, ok bool) {
	r := fastReader{b: b}
	if n, ok := r.head(majMap); !ok || n != 1 {
		return nil, false
	}
	key, ok := r.textBytes()
	if !ok {
		return nil, false
	}
	switch string(key) {
	case "report":
		rep, ok := r.report()
		if !ok || r.off != len(b) {
			return nil, false
		}
		return rep, true
	case "batch":
		n, ok := r.head(majArray)
		// An item takes at least 8 bytes ({"report": {...}}): a count
		// beyond that is malformed, and must not size an allocation.
		if !ok || n == 0 || n > uint64(len(b)-r.off)/8 {
			return nil, false
		}
		cmds := make([]Command, n)
		for i := range cmds {
			if m, ok := r.head(majMap); !ok || m != 1 {
				return nil, false
			}
			if key, ok := r.textBytes(); !ok || string(key) != "report" {
				return nil, false
			}
			rep, ok := r.report()
			if !ok {
				return nil, false
			}
			cmds[i] = rep
		}
		if r.off != len(b) {
			return nil, false
		}
		return Batch{Commands: cmds}, true
	default:
		return nil, false
	}
}

// CBOR major types, shifted into the initial byte's top three bits.
const (
	majUint  = 0 << 5
	majNeg   = 1 << 5
	majBytes = 2 << 5
	majText  = 3 << 5
	majArray = 4 << 5
	majMap   = 5 << 5
)

// fastReader reads CBOR items from canonical bytes. Every method reports
// false, and reads nothing more, on an item of another type or bytes that
// end early.
type fastReader struct {
	b   []byte
	off int
}

// head reads a head of the given major type and returns its argument.
func (r *fastReader) head(major byte) (uint64, bool) {
	if r.off >= len(r.b) || r.b[r.off]&0xe0 != major {
		return 0, false
	}
	ai := r.b[r.off] & 0x1f
	r.off++
	switch {
	case ai < 24:
		return uint64(ai), true
	case ai <= 27:
		n := 1 << (ai - 24)
		if len(r.b)-r.off < n {
			return 0, false
		}
		var v uint64
		switch n {
		case 1:
			v = uint64(r.b[r.off])
		case 2:
			v = uint64(binary.BigEndian.Uint16(r.b[r.off:]))
		case 4:
			v = uint64(binary.BigEndian.Uint32(r.b[r.off:]))
		default:
			v = binary.BigEndian.Uint64(r.b[r.off:])
		}
		r.off += n
		return v, true
	default:
		return 0, false
	}
}

// raw reads a byte or text string's content, of the given major type.
func (r *fastReader) raw(major byte) ([]byte, bool) {
	n, ok := r.head(major)
	if !ok || n > uint64(len(r.b)-r.off) {
		return nil, false
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, true
}

// textBytes reads a text string that is valid UTF-8, without copying it.
func (r *fastReader) textBytes() ([]byte, bool) {
	s, ok := r.raw(majText)
	if !ok || !utf8.Valid(s) {
		return nil, false
	}
	return s, true
}

func (r *fastReader) text() (string, bool) {
	s, ok := r.textBytes()
	return string(s), ok
}

// ref reads a text string that is a well-formed ref.
func (r *fastReader) ref() (content.Ref, bool) {
	s, ok := r.text()
	if !ok || !content.IsRef(s) {
		return "", false
	}
	return content.Ref(s), true
}

// int64 reads an integer that fits in an int64.
func (r *fastReader) int64() (int64, bool) {
	if r.off >= len(r.b) {
		return 0, false
	}
	neg := r.b[r.off]&0xe0 == majNeg
	major := byte(majUint)
	if neg {
		major = majNeg
	}
	v, ok := r.head(major)
	if !ok || v > math.MaxInt64 {
		return 0, false
	}
	if neg {
		return -1 - int64(v), true
	}
	return int64(v), true
}

// Fields of ReportResult, as bits, to check that each required one came.
const (
	fieldPeer = 1 << iota
	fieldJob
	fieldShard
	fieldResult
	fieldNow
	reportRequired = fieldPeer | fieldJob | fieldShard | fieldResult | fieldNow
)

// report reads a ReportResult's map (ReportResult's cbor tags).
func (r *fastReader) report() (ReportResult, bool) {
	var c ReportResult
	n, ok := r.head(majMap)
	if !ok {
		return c, false
	}
	seen := 0
	for range n {
		key, ok := r.textBytes()
		if !ok {
			return c, false
		}
		switch string(key) {
		case "peer":
			c.Peer, ok = r.text()
			seen |= fieldPeer
		case "job":
			c.Job, ok = r.ref()
			seen |= fieldJob
		case "shard":
			var v int64
			v, ok = r.int64()
			c.Shard = int(v)
			ok = ok && int64(c.Shard) == v
			seen |= fieldShard
		case "result":
			c.Result, ok = r.ref()
			seen |= fieldResult
		case "nonce":
			c.Nonce, ok = r.text()
			ok = ok && c.Nonce != ""
		case "key":
			c.Key, ok = r.text()
			ok = ok && c.Key != ""
		case "sig":
			var s []byte
			s, ok = r.raw(majBytes)
			ok = ok && len(s) > 0
			c.Sig = append([]byte(nil), s...)
		case "path":
			var s []byte
			s, ok = r.raw(majBytes)
			ok = ok && len(s) > 0
			c.Path = append([]byte(nil), s...)
		case "now":
			c.Now, ok = r.int64()
			seen |= fieldNow
		default:
			return c, false
		}
		if !ok {
			return c, false
		}
	}
	return c, seen == reportRequired
}
