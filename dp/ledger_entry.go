package dp

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/scellis/scellis/content"
)

// Ledger file format, version 1.
//
//	file   = magic frame*
//	magic  = "SCLEDGR1" (8 bytes)
//	frame  = length:uint32be payload:length bytes crc:uint32be
//	         (crc is CRC-32C of the length field and the payload)
//	payload = canonical CBOR map {"body": bstr, "hash": tstr, "sig": bstr}
//	body    = canonical CBOR of Entry (the signed part)
//	hash    = content.Hash(body) = "sha256:<hex>"
//	sig     = Ed25519(silo key, "scellis/dp/ledger-entry/v1\x00" || sha256(body))
//
// The CRC only tells a torn write from a complete one; integrity against a
// person comes from the hash chain (each body names the previous entry's
// hash) and the signatures. Every decoder rejects non-canonical bytes, so an
// entry has exactly one encoding.

const (
	fileMagic = "SCLEDGR1"
	// maxRecord bounds one frame's payload. Entries are a few kilobytes.
	maxRecord = 1 << 20
	// frameOverhead is the length and CRC fields around a payload.
	frameOverhead = 8

	// FormatVersion is the ledger format this package writes and reads.
	FormatVersion = 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// signDomain separates ledger signatures from every other use of the key.
const signDomain = "scellis/dp/ledger-entry/v1\x00"

// EntryKind says what an entry records.
type EntryKind string

const (
	// KindGenesis is entry 0: the ledger's key, order grid and conversion.
	KindGenesis EntryKind = "genesis"
	// KindBudget declares a dataset's budget (ε_max, δ). Once per dataset.
	KindBudget EntryKind = "budget"
	// KindCharge spends privacy of one dataset.
	KindCharge EntryKind = "charge"
)

// Entry is one signed, hash-chained ledger entry. Exactly one of Genesis,
// Budget and Charge is set, matching Kind. Hash and Sig are carried next to
// the signed body, not inside it.
type Entry struct {
	Seq     uint64      `cbor:"seq" json:"seq"`
	Kind    EntryKind   `cbor:"kind" json:"kind"`
	Time    int64       `cbor:"time" json:"time_unix_ns"` // Unix nanoseconds, informational
	Prev    content.Ref `cbor:"prev" json:"prev"`         // hash of entry Seq-1; "" for genesis
	Genesis *Genesis    `cbor:"genesis,omitempty" json:"genesis,omitempty"`
	Budget  *Budget     `cbor:"budget,omitempty" json:"budget,omitempty"`
	Charge  *Charge     `cbor:"charge,omitempty" json:"charge,omitempty"`

	Hash content.Ref `cbor:"-" json:"hash"`
	Sig  []byte      `cbor:"-" json:"sig"`
}

// At returns the entry's time.
func (e *Entry) At() time.Time { return time.Unix(0, e.Time).UTC() }

// Genesis opens a ledger: it fixes the key every entry is signed with, the
// Rényi orders every RDP curve is given on, and the conversion to (ε, δ).
type Genesis struct {
	Format     int       `cbor:"format" json:"format"`
	PublicKey  []byte    `cbor:"pubkey" json:"public_key"`
	Orders     []float64 `cbor:"orders" json:"orders"`
	Conversion string    `cbor:"conversion" json:"conversion"`
	Silo       string    `cbor:"silo,omitempty" json:"silo,omitempty"`
	Nonce      []byte    `cbor:"nonce" json:"nonce"` // 16 random bytes: no two ledgers share a genesis hash
}

// Budget is a dataset's privacy budget: its cumulative ε at δ may never
// exceed Epsilon.
type Budget struct {
	Dataset string  `cbor:"dataset" json:"dataset"`
	Epsilon float64 `cbor:"epsilon" json:"epsilon"`
	Delta   float64 `cbor:"delta" json:"delta"`
}

// Charge is one accepted privacy charge.
type Charge struct {
	Dataset    string      `cbor:"dataset" json:"dataset"`
	Consumer   string      `cbor:"consumer" json:"consumer"` // job or round ID
	Mechanisms []Mechanism `cbor:"mechanisms" json:"mechanisms"`
	// RDP is the curve this charge adds, on the genesis orders.
	RDP []float64 `cbor:"rdp" json:"rdp"`
	// Epsilon is this charge alone, converted at the dataset's δ.
	Epsilon float64 `cbor:"epsilon" json:"epsilon"`
	// Cumulative is the dataset's ε at δ after this charge (all charges
	// composed in RDP space), and Order the order that attains it.
	Cumulative float64 `cbor:"cumulative" json:"cumulative_epsilon"`
	Order      float64 `cbor:"order" json:"order"`
}

// record is the frame payload.
type record struct {
	Body []byte      `cbor:"body"`
	Hash content.Ref `cbor:"hash"`
	Sig  []byte      `cbor:"sig"`
}

// errFormat marks a payload that is not a well-formed entry.
var errFormat = errors.New("malformed entry")

// sealEntry encodes e's body, sets e.Hash and e.Sig, and returns the frame
// payload.
func sealEntry(e *Entry, key ed25519.PrivateKey) ([]byte, error) {
	body, err := content.Encode(e)
	if err != nil {
		return nil, err
	}
	e.Hash = content.Hash(body)
	e.Sig = ed25519.Sign(key, signedMessage(e.Hash))
	return content.Encode(record{Body: body, Hash: e.Hash, Sig: e.Sig})
}

func signedMessage(h content.Ref) []byte {
	return append([]byte(signDomain), h.Digest()...)
}

// decodeRecord parses a frame payload into an Entry. It checks that the
// bytes are canonical (re-encoding gives the same bytes) and that the stored
// hash is the hash of the body; it does not check the signature or the
// chain, which need the ledger's state.
func decodeRecord(p []byte) (*Entry, error) {
	var r record
	if err := content.Decode(p, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", errFormat, err)
	}
	if again, err := content.Encode(r); err != nil || !bytes.Equal(again, p) {
		return nil, fmt.Errorf("%w: record is not canonically encoded", errFormat)
	}
	var e Entry
	if err := content.Decode(r.Body, &e); err != nil {
		return nil, fmt.Errorf("%w: body: %v", errFormat, err)
	}
	if again, err := content.Encode(&e); err != nil || !bytes.Equal(again, r.Body) {
		return nil, fmt.Errorf("%w: body is not canonically encoded", errFormat)
	}
	if got := content.Hash(r.Body); got != r.Hash {
		return nil, fmt.Errorf("%w: stored hash %s is not the hash of the body (%s)", errFormat, r.Hash.Short(), got.Short())
	}
	e.Hash, e.Sig = r.Hash, r.Sig
	return &e, nil
}

// appendFrame appends the frame of payload p to dst.
func appendFrame(dst, p []byte) []byte {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	crc := crc32.Update(0, crcTable, hdr[:])
	crc = crc32.Update(crc, crcTable, p)
	dst = append(dst, hdr[:]...)
	dst = append(dst, p...)
	return binary.BigEndian.AppendUint32(dst, crc)
}

// frameResult is what scanning one frame found.
type frameResult int

const (
	frameOK          frameResult = iota
	frameEnd                     // no bytes left
	frameTorn                    // an incomplete last frame: a write cut short
	frameDamagedLast             // a complete-length last frame failing its CRC
	frameCorrupt                 // a damaged frame with data after it, or a nonsense length
)

// nextFrame looks at data (the bytes of the file from the frame's offset to
// the end of the file) and returns the payload of the frame there and the
// frame's total size.
//
// A frame is torn when it is the last thing in the file and shorter than its
// length field says (a write cut short: kill -9 mid-write can only do this),
// or when the remaining bytes are all zero (a file extended by the
// filesystem before its data landed). A last frame of full length failing
// its CRC is damaged-last: a power loss that persisted part of the write, or
// an edit; a writer cuts it like a torn one, but verification reports it.
// Anything else that does not parse is corrupt.
func nextFrame(data []byte) (payload []byte, size int, res frameResult, why string) {
	if len(data) == 0 {
		return nil, 0, frameEnd, ""
	}
	if allZero(data) {
		return nil, 0, frameTorn, "zero-filled tail"
	}
	if len(data) < 4 {
		return nil, 0, frameTorn, "incomplete frame header"
	}
	n := binary.BigEndian.Uint32(data)
	if n == 0 || n > maxRecord {
		return nil, 0, frameCorrupt, fmt.Sprintf("frame length %d is out of range", n)
	}
	total := int(n) + frameOverhead
	if len(data) < total {
		return nil, 0, frameTorn, fmt.Sprintf("frame of %d bytes cut at %d", total, len(data))
	}
	crc := crc32.Update(0, crcTable, data[:4+n])
	if binary.BigEndian.Uint32(data[4+n:]) != crc {
		if len(data) == total {
			return nil, 0, frameDamagedLast, "last frame fails its checksum"
		}
		return nil, 0, frameCorrupt, "frame fails its checksum"
	}
	return data[4 : 4+n], total, frameOK, ""
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
