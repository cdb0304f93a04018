package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/crypto/chacha20"
)

// The masking kernel. A round's vector lives in one byte layout from the
// client's encoding to the server's sum: Dim value coordinates of 4 bytes
// (ring Z_2^32) or 8 bytes (Z_2^64), then, on a weighted round, one 8-byte
// weight coordinate (always Z_2^64: its bound is the weight's, not the
// values'). That layout is the masked input on the wire, so the client
// writes its output in place and the server adds inputs and removes masks
// in place: no d-sized intermediate vector is ever made.
//
// A mask is the keystream of its key read as little-endian words of the
// layout: bytes [o, o+w) of the keystream mask the coordinate at bytes
// [o, o+w). The vector is cut into segments, one per core, aligned to the
// keystream blocks so each segment seeks every keystream to its own
// offset; within a segment the kernel works tile by tile, and each tile
// (8 KiB, in L1) receives its encoding and every mask before the next:
// the vector crosses the memory bus once, whatever the number of masks.
// The keystream passes through one tile-sized scratch per core, because
// crypto/cipher hands keystreams out as bytes.

// layout is how a round's vector sits in the ring and on the wire.
type layout struct {
	vals   int  // value coordinates
	width  int  // bytes per value coordinate: 4 or 8
	weight bool // one more 8-byte coordinate after the values
}

// size is the length in bytes of a vector.
func (l layout) size() int {
	n := l.vals * l.width
	if l.weight {
		n += 8
	}
	return n
}

// weightOff is the byte offset of the weight coordinate.
func (l layout) weightOff() int { return l.vals * l.width }

const (
	// tileBytes is the unit of work: a tile of the vector and its
	// keystream fit in L1 together, and the per-call overhead of the
	// keystream is amortised.
	tileBytes = 8 << 10
	// segAlign aligns segments to whole keystream blocks (AES: 16 bytes,
	// ChaCha20: 64), so a segment seeks a keystream without discarding.
	segAlign = 64
	// parMinBytes is the smallest segment worth a goroutine.
	parMinBytes = 128 << 10
)

// segment is a byte range of a vector whose coordinates are width bytes.
type segment struct{ off, end, width int }

// segments cuts the vector into at most parts segments of the value
// coordinates (aligned to segAlign) and the weight coordinate.
func (l layout) segments(parts int) []segment {
	vb := l.vals * l.width
	parts = max(1, min(parts, vb/parMinBytes))
	per := (vb/parts + segAlign - 1) / segAlign * segAlign
	var out []segment
	for off := 0; off < vb; off += per {
		out = append(out, segment{off, min(off+per, vb), l.width})
	}
	if l.weight {
		out = append(out, segment{vb, vb + 8, 8})
	}
	return out
}

// streamAt returns the keystream of g under a 32-byte key, positioned at
// byte off: the keystream of stream(key) with its first off bytes skipped.
// Both ciphers seek by their block counter, which is what lets segments
// of one mask be expanded on different cores.
func (g PRG) streamAt(key []byte, off int) cipher.Stream {
	var s cipher.Stream
	var skip int
	switch g {
	case AESCTR:
		b, err := aes.NewCipher(key)
		if err != nil {
			panic("secagg: aes key: " + err.Error())
		}
		var iv [aes.BlockSize]byte
		binary.BigEndian.PutUint64(iv[8:], uint64(off/aes.BlockSize))
		s, skip = cipher.NewCTR(b, iv[:]), off%aes.BlockSize
	case ChaCha20:
		c, err := chacha20.NewUnauthenticatedCipher(key, zeroNonce[:])
		if err != nil {
			panic("secagg: chacha20 key: " + err.Error())
		}
		c.SetCounter(uint32(off / 64))
		s, skip = c, off%64
	default:
		panic(fmt.Sprintf("secagg: unknown PRG %q reached the keystream", string(g)))
	}
	if skip > 0 {
		var b [64]byte
		s.XORKeyStream(b[:skip], b[:skip])
	}
	return s
}

// scratch is one core's working memory: the keystream tile, and what a
// fill function keeps between the tiles of its segment.
type scratch struct {
	ks   [tileBytes]byte
	rd   *rounder // the client's stochastic rounding, seeked per segment
	next int      // coordinate index rd is positioned at
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// fillFunc writes (or adds) the plaintext part of the coordinates in
// vec[lo:hi] (width bytes each) before the masks are applied to them.
type fillFunc func(sc *scratch, vec []byte, lo, hi, width int)

// applyMasks runs fill (if any) over vec and adds (sign > 0) or subtracts
// every mask's keystream, tile by tile, on all cores. Masks are expanded
// with g; each key is used for one keystream only.
func applyMasks(g PRG, vec []byte, l layout, masks []mask, fill fillFunc) {
	if len(vec) != l.size() {
		panic(fmt.Sprintf("secagg: vector of %d bytes for a layout of %d", len(vec), l.size()))
	}
	segs := l.segments(runtime.GOMAXPROCS(0))
	if len(segs) == 1 {
		applySegment(g, vec, segs[0], masks, fill)
		return
	}
	var wg sync.WaitGroup
	for _, sg := range segs[1:] {
		wg.Go(func() { applySegment(g, vec, sg, masks, fill) })
	}
	applySegment(g, vec, segs[0], masks, fill)
	wg.Wait()
}

func applySegment(g PRG, vec []byte, sg segment, masks []mask, fill fillFunc) {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		clear(sc.ks[:])
		sc.rd = nil
		scratchPool.Put(sc)
	}()
	streams := make([]cipher.Stream, len(masks))
	for i, mk := range masks {
		streams[i] = g.streamAt(mk.key, sg.off)
	}
	for lo := sg.off; lo < sg.end; lo += tileBytes {
		hi := min(lo+tileBytes, sg.end)
		tile := vec[lo:hi]
		if fill != nil {
			fill(sc, vec, lo, hi, sg.width)
		}
		ks := sc.ks[:len(tile)]
		for i, s := range streams {
			s.XORKeyStream(ks, zeroChunk[:len(ks)])
			addWords(tile, ks, sg.width, masks[i].sign < 0)
		}
	}
}

// addWords adds (or subtracts) the little-endian words of ks to those of
// dst, word by word in Z_2^(8·width). The bulk goes 64 bytes at a time
// through array pointers, so the loop carries one bounds check per 64
// bytes instead of two per word.
func addWords(dst, ks []byte, width int, sub bool) {
	ks = ks[:len(dst)]
	for len(dst) >= 64 {
		d, k := (*[64]byte)(dst), (*[64]byte)(ks)
		switch {
		case width == 8 && !sub:
			add64x8(d, k)
		case width == 8:
			sub64x8(d, k)
		case !sub:
			add32x16(d, k)
		default:
			sub32x16(d, k)
		}
		dst, ks = dst[64:], ks[64:]
	}
	for len(dst) >= width {
		if width == 8 {
			a, b := binary.LittleEndian.Uint64(dst), binary.LittleEndian.Uint64(ks)
			if sub {
				b = -b
			}
			binary.LittleEndian.PutUint64(dst, a+b)
		} else {
			a, b := binary.LittleEndian.Uint32(dst), binary.LittleEndian.Uint32(ks)
			if sub {
				b = -b
			}
			binary.LittleEndian.PutUint32(dst, a+b)
		}
		dst, ks = dst[width:], ks[width:]
	}
}

var le = binary.LittleEndian

func add64x8(d, k *[64]byte) {
	for i := 0; i < 64; i += 8 {
		le.PutUint64(d[i:i+8], le.Uint64(d[i:i+8])+le.Uint64(k[i:i+8]))
	}
}

func sub64x8(d, k *[64]byte) {
	for i := 0; i < 64; i += 8 {
		le.PutUint64(d[i:i+8], le.Uint64(d[i:i+8])-le.Uint64(k[i:i+8]))
	}
}

// The 32-bit ring adds two lanes per 64-bit word (SWAR, Hacker's Delight
// 2-18): the low 31 bits of each lane add without reaching the next lane,
// and the top bit of each lane is the XOR of the operands' top bits and
// that carry. So Z_2^32 costs the same per byte as Z_2^64.
const lanesHigh = 0x8000000080000000

func add32x16(d, k *[64]byte) {
	for i := 0; i < 64; i += 8 {
		a, b := le.Uint64(d[i:i+8]), le.Uint64(k[i:i+8])
		le.PutUint64(d[i:i+8], ((a&^lanesHigh)+(b&^lanesHigh))^((a^b)&lanesHigh))
	}
}

func sub32x16(d, k *[64]byte) {
	for i := 0; i < 64; i += 8 {
		a, b := le.Uint64(d[i:i+8]), le.Uint64(k[i:i+8])
		le.PutUint64(d[i:i+8], ((a|lanesHigh)-(b&^lanesHigh))^((a^^b)&lanesHigh))
	}
}

// putWord writes the ring image of v (two's complement, truncated to the
// coordinate's width) at dst.
func putWord(dst []byte, width int, v uint64) {
	if width == 8 {
		binary.LittleEndian.PutUint64(dst, v)
	} else {
		binary.LittleEndian.PutUint32(dst, uint32(v))
	}
}

// wordAt reads the coordinate at src as a signed integer: the exact sum
// whenever the round's bound holds (|sum| < 2^(8·width−1)).
func wordAt(src []byte, width int) int64 {
	if width == 8 {
		return int64(binary.LittleEndian.Uint64(src))
	}
	return int64(int32(binary.LittleEndian.Uint32(src)))
}

// addVectors adds the ring vector in to acc (both in layout l), on all
// cores: the server's accumulation of a masked input.
func addVectors(acc, in []byte, l layout) {
	applyMasks(AESCTR, acc, l, nil, func(_ *scratch, vec []byte, lo, hi, width int) {
		addWords(vec[lo:hi], in[lo:hi], width, false)
	})
}
