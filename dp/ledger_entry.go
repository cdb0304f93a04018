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
	"github.com/scellis/scellis/identity"
)

// Ledger file format, version 2 (written by this package).
//
//	file    = magic frame*
//	magic   = "SCLEDGR2" (8 bytes)
//	frame   = length:uint32be hcrc:uint32be payload:length bytes crc:uint32be
//	          hcrc is CRC-32C of the length field alone; crc is CRC-32C of
//	          the length field and the payload
//	payload = canonical CBOR map {"body": bstr, "hash": tstr, "sig": bstr}
//	body    = canonical CBOR of Entry (the signed part), Genesis.Format = 2
//	hash    = content.Hash(body) = "sha256:<hex>"
//	sig     = Ed25519ctx(silo key, context identity.PurposeLedgerEntry,
//	          sha256(body)) (RFC 8032 §5.1: domain-separated from every other
//	          signature the key makes)
//
// Version 1 ("SCLEDGR1", Genesis.Format = 1) has no hcrc (8 bytes of frame
// overhead) and signs with pure Ed25519 over
// "scellis/dp/ledger-entry/v1\x00" || sha256(body). Ledgers of version 1 are
// still read, verified and charged (in version 1, so their hash chain and
// the receipts that cite it stay valid); new ledgers are version 2.
//
// The CRCs tell a torn write from a complete one and a damaged length field
// from an honest one; integrity against a person comes from the hash chain
// (each body names the previous entry's hash) and the signatures. Every
// decoder rejects non-canonical bytes, so an entry has exactly one encoding.
//
// Crash or corruption: kill -9 or a power loss can only leave a final frame
// shorter than its length field (or a zero-filled tail), and such a frame
// holds no complete entry. So only a final frame that is shorter than its
// (checksummed) length and holds no complete frame or entry anywhere in its
// bytes is a torn write, which a writer cuts off (saving the bytes aside).
// Anything else that does not parse is corruption: verification fails at its
// offset and no charge is written until an operator restores the ledger.

const (
	fileMagic   = "SCLEDGR2"
	fileMagicV1 = "SCLEDGR1"
	// maxRecord bounds one frame's payload. Entries are a few kilobytes.
	maxRecord = 1 << 20

	// FormatVersion is the ledger format this package writes; it also
	// reads and charges format 1.
	FormatVersion = 2
)

// frameOverhead is the length, header-CRC and CRC fields around a payload
// in format v.
func frameOverhead(v int) int {
	if v == 1 {
		return 8
	}
	return 12
}

// headerSize is the bytes before the payload in format v.
func headerSize(v int) int { return frameOverhead(v) - 4 }

// formatOfMagic returns the format a file's magic announces, 0 if none.
func formatOfMagic(b []byte) int {
	if len(b) < len(fileMagic) {
		return 0
	}
	switch string(b[:len(fileMagic)]) {
	case fileMagic:
		return 2
	case fileMagicV1:
		return 1
	}
	return 0
}

func magicOf(v int) string {
	if v == 1 {
		return fileMagicV1
	}
	return fileMagic
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// signDomainV1 separated format-1 ledger signatures (pure Ed25519) from
// other uses of the key; format 2 uses Ed25519ctx with
// identity.PurposeLedgerEntry instead.
const signDomainV1 = "scellis/dp/ledger-entry/v1\x00"

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

// sealEntry encodes e's body, sets e.Hash and e.Sig (in format v), and
// returns the frame payload.
func sealEntry(e *Entry, key ed25519.PrivateKey, v int) ([]byte, error) {
	body, err := content.Encode(e)
	if err != nil {
		return nil, err
	}
	e.Hash = content.Hash(body)
	if v == 1 {
		e.Sig = ed25519.Sign(key, append([]byte(signDomainV1), e.Hash.Digest()...))
	} else {
		e.Sig = identity.Sign(identity.FromPrivateKey(key), identity.PurposeLedgerEntry, e.Hash.Digest())
	}
	return content.Encode(record{Body: body, Hash: e.Hash, Sig: e.Sig})
}

// verifySig reports whether sig is pub's signature of the entry hash h in
// format v.
func verifySig(pub ed25519.PublicKey, h content.Ref, sig []byte, v int) bool {
	if len(sig) != ed25519.SignatureSize || len(pub) != ed25519.PublicKeySize {
		return false
	}
	if v == 1 {
		return ed25519.Verify(pub, append([]byte(signDomainV1), h.Digest()...), sig)
	}
	var k identity.PublicKey
	copy(k[:], pub)
	return identity.Verify(k, identity.PurposeLedgerEntry, h.Digest(), sig)
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

// appendFrame appends the frame of payload p in format v to dst.
func appendFrame(dst, p []byte, v int) []byte {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	crc := crc32.Update(0, crcTable, hdr[:])
	dst = append(dst, hdr[:]...)
	if v != 1 {
		dst = binary.BigEndian.AppendUint32(dst, crc)
	}
	crc = crc32.Update(crc, crcTable, p)
	dst = append(dst, p...)
	return binary.BigEndian.AppendUint32(dst, crc)
}

// frameResult is what scanning one frame found.
type frameResult int

const (
	frameOK      frameResult = iota
	frameEnd                 // no bytes left
	frameTorn                // an incomplete last frame holding no entry: a write cut short
	frameCorrupt             // anything else that does not parse
)

// nextFrame looks at data (the bytes of the file from the frame's offset to
// the end of the file) and returns the payload of the frame there, in
// format v, and the frame's total size.
//
// A frame is torn only when it is the last thing in the file, shorter than
// its length field says, and its bytes hold no complete entry (a write cut
// short: kill -9 mid-write can only do this), or when the remaining bytes
// are all zero (a file extended by the filesystem before its data landed).
// In format 2 the length field must first pass its own checksum. Anything
// else — a damaged length, a full-length frame failing its CRC (even the
// last), a "torn" frame that holds a complete entry — is corrupt: a writer
// never cuts it.
func nextFrame(data []byte, v int) (payload []byte, size int, res frameResult, why string) {
	switch {
	case len(data) == 0:
		return nil, 0, frameEnd, ""
	case allZero(data):
		return nil, 0, frameTorn, "zero-filled tail"
	case len(data) < headerSize(v):
		return nil, 0, frameTorn, "incomplete frame header"
	}
	payload, size, short, why := parseFrame(data, v)
	switch {
	case short:
		if held := holdsEntry(data, v); held != "" {
			return nil, 0, frameCorrupt, fmt.Sprintf("the last frame claims %d bytes and only %d follow, but it holds %s: not a torn write", size, len(data), held)
		}
		return nil, 0, frameTorn, fmt.Sprintf("frame of %d bytes cut at %d", size, len(data))
	case why != "":
		return nil, 0, frameCorrupt, why
	}
	return payload, size, frameOK, ""
}

// parseFrame parses the frame in format v at the start of data (at least
// its header). It returns the payload and the frame's size, or why the
// bytes are no frame; short reports a frame whose header is valid but whose
// claimed size exceeds data (size is then the claimed size).
func parseFrame(data []byte, v int) (payload []byte, size int, short bool, why string) {
	hs := headerSize(v)
	n := binary.BigEndian.Uint32(data)
	crc := crc32.Update(0, crcTable, data[:4])
	if v != 1 && binary.BigEndian.Uint32(data[4:]) != crc {
		return nil, 0, false, "the frame's length field fails its checksum (the length was altered)"
	}
	if n == 0 || n > maxRecord {
		return nil, 0, false, fmt.Sprintf("frame length %d is out of range", n)
	}
	size = int(n) + frameOverhead(v)
	if len(data) < size {
		return nil, size, true, ""
	}
	crc = crc32.Update(crc, crcTable, data[hs:hs+int(n)])
	if binary.BigEndian.Uint32(data[hs+int(n):]) != crc {
		return nil, 0, false, "frame fails its checksum"
	}
	return data[hs : hs+int(n)], size, false, ""
}

// holdsEntry reports what complete entry the bytes of an apparently torn
// last frame (starting at its header) hold, "" if none: a record decoding
// from the start of the payload (whatever the length field says), or a
// frame with valid checksums at any later offset. A crash cannot produce
// either, so such bytes are never cut.
func holdsEntry(data []byte, v int) string {
	hs := headerSize(v)
	if len(data) > hs {
		if rest, err := content.DecodeFirst(data[hs:]); err == nil {
			if _, err := decodeRecord(data[hs : len(data)-len(rest)]); err == nil {
				return "a complete entry after its header"
			}
		}
	}
	for off := 1; off+frameOverhead(v) <= len(data); off++ {
		if _, _, short, why := parseFrame(data[off:], v); !short && why == "" {
			return fmt.Sprintf("a complete frame at byte +%d", off)
		}
	}
	return ""
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
