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
// layout: bytes [o, o+8) of the keystream mask the 8-byte word at bytes
// [o, o+8) — a coordinate of Z_2^64, or a pair of 4-byte coordinates
// carried as one element of Z_2^64 (see putCoords); a last odd 4-byte
// coordinate takes bytes [o, o+4) in Z_2^32. The vector is cut into
// segments, one per core, aligned to the keystream blocks so each segment
// seeks every keystream to its own offset; within a segment the kernel
// works tile by tile, and each tile (4 KiB) receives its encoding and
// every mask before the next: the vector crosses the memory bus once,
// whatever the number of masks. Masks go in batches of maskBatch: each
// keystream of a batch is read out into its own tile of scratch (because
// crypto/cipher hands keystreams out as bytes), then one pass adds them
// all to the vector's tile.

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
	tileBytes = 4 << 10
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

// maskBatch masks are added to a tile in one pass: the tile is loaded
// and stored once per batch instead of once per mask.
const maskBatch = 4

// scratch is one core's working memory: a batch of keystream tiles, and
// what a fill function keeps between the tiles of its segment.
type scratch struct {
	ks [maskBatch][tileBytes]byte
	// rk holds rounding draws read ahead, rk[rkOff:rkEnd] not yet used:
	// a keystream call of a whole tile's bytes serves two tiles of 4-byte
	// coordinates or four of 8-byte ones. Read a tile at a time (1 KiB a
	// call at 8-byte coordinates), the draws cost 1.4× the masks'
	// keystream per byte in a profile of the client at n = 3: the
	// cipher's per-call overhead.
	rk           [tileBytes]byte
	rkOff, rkEnd int
	rd           *rounder // the client's stochastic rounding, seeked per segment
	next         int      // coordinate index of the draw at rk[rkOff] (rd's position when rkOff = rkEnd)
}

// takeDraws returns the rounding draws of n coordinates from i on, from
// rd seeked to i unless the draws read ahead continue there.
func (sc *scratch) takeDraws(rd *rounder, i, n int) []byte {
	if sc.rd == nil || sc.next != i {
		sc.rd, sc.rkOff, sc.rkEnd = rd.at(i), 0, 0
	}
	need := roundBytes * n
	if sc.rkEnd-sc.rkOff < need {
		left := copy(sc.rk[:], sc.rk[sc.rkOff:sc.rkEnd]) // the next draws in sequence
		sc.rd.draws(sc.rk[left:])
		sc.rkOff, sc.rkEnd = 0, len(sc.rk)
	}
	d := sc.rk[sc.rkOff : sc.rkOff+need]
	sc.rkOff += need
	sc.next = i + n
	return d
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// fillFunc writes (or adds) the plaintext part of the coordinates in
// vec[lo:hi] (width bytes each) together with the first batch of masks:
// c plus the words of src[:k], the batch's keystream tiles (k = 0: no
// mask; see sumWords). The masks' first pass over the tile is the
// plaintext's: the client encodes x and adds its first masks with one
// store per word (encodeAddTile).
type fillFunc func(sc *scratch, vec []byte, lo, hi, width int, c uint64, src *[maskBatch][]byte, k int)

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

// applySegment masks one segment, tile by tile. A subtracted mask is
// read out as the complement of its keystream (XORed onto all-ones
// bytes), ^k = −k − 1 in every word, so a batch is a plain sum of words
// plus one per subtracted mask: no sign is handled inside the loop.
func applySegment(g PRG, vec []byte, sg segment, masks []mask, fill fillFunc) {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		for i := range sc.ks {
			clear(sc.ks[i][:])
		}
		clear(sc.rk[:])
		sc.rd, sc.rkOff, sc.rkEnd = nil, 0, 0
		scratchPool.Put(sc)
	}()
	streams := make([]cipher.Stream, len(masks))
	for i, mk := range masks {
		streams[i] = g.streamAt(mk.key, sg.off)
	}
	var src [maskBatch][]byte
	// readBatch reads out the keystreams of masks[b:b+maskBatch] for a
	// tile of n bytes into src, and returns how many and the count of
	// subtracted ones.
	// next is what is left to prefetch of the vector's next tile: a part
	// before each keystream call, so its lines arrive while the cipher
	// runs. Without it the additions waited for the tile in bursts (the
	// hardware prefetcher follows a stream only a few lines ahead): the
	// kernel with three masks and no fill, as the server unmasks, took
	// 1.21–1.24× the floor's CPU time and 1.10–1.24× with it; the client,
	// whose encoding prefetches its own output, gains nothing.
	var next []byte
	readBatch := func(b, n int) (k int, neg uint64) {
		batch := masks[b:min(b+maskBatch, len(masks))]
		for j, mk := range batch {
			if len(next) > 0 {
				m := min(len(next), (len(next)/(len(batch)-j)+63)&^63)
				prefetchBytes(next[:m])
				next = next[m:]
			}
			ks := sc.ks[j][:n]
			if mk.sign < 0 {
				streams[b+j].XORKeyStream(ks, onesChunk[:n])
				neg++
			} else {
				streams[b+j].XORKeyStream(ks, zeroChunk[:n])
			}
			src[j] = ks
		}
		return len(batch), neg
	}
	for lo := sg.off; lo < sg.end; lo += tileBytes {
		hi := min(lo+tileBytes, sg.end)
		tile := vec[lo:hi]
		if hi < sg.end {
			next = vec[hi:min(hi+tileBytes, sg.end)]
		}
		b := 0
		if fill != nil {
			k, neg := readBatch(0, len(tile))
			fill(sc, vec, lo, hi, sg.width, neg, &src, k)
			b = k
		}
		for ; b < len(masks); b += maskBatch {
			k, neg := readBatch(b, len(tile))
			sumWords(tile, neg, &src, k)
		}
	}
}

// onesChunk is the plaintext a subtracted mask's keystream is XORed onto.
var onesChunk = func() (b [tileBytes]byte) {
	for i := range b {
		b[i] = 0xff
	}
	return b
}()

// sumWords adds the first k tiles of src and c·(1, 1, …) to dst, in
// 64-bit little-endian words, and a last 4-byte word (the odd value
// coordinate of a 32-bit ring) in 32 bits. A pair of 4-byte coordinates
// is one word of Z_2^64 (see putCoords), so both rings add the same way.
func sumWords(dst []byte, c uint64, src *[maskBatch][]byte, k int) {
	if k == 0 {
		// No mask: c counts subtracted masks, so it is 0 too.
		if c != 0 {
			panic("secagg: sumWords: a subtracted-mask count without masks")
		}
		return
	}
	sumBulk(dst, c, src, k)
	o := len(dst) &^ 63
	for ; o+8 <= len(dst); o += 8 {
		v := le.Uint64(dst[o:]) + c
		for _, s := range src[:k] {
			v += le.Uint64(s[o:])
		}
		le.PutUint64(dst[o:], v)
	}
	if o+4 <= len(dst) {
		v := le.Uint32(dst[o:]) + uint32(c)
		for _, s := range src[:k] {
			v += le.Uint32(s[o:])
		}
		le.PutUint32(dst[o:], v)
	}
}

// sumBulkGo is sumBulk in Go, where AVX2 is missing (or the purego
// build tag is set): sum1 … sum4 go 64 bytes at a time through array
// pointers (no bounds checks inside), unrolled: the adds are a fifth of
// the keystream's cost this way, against half with a loop per mask.
func sumBulkGo(dst []byte, c uint64, src *[maskBatch][]byte, k int) {
	switch k {
	case 1:
		sum1(dst, c, src)
	case 2:
		sum2(dst, c, src)
	case 3:
		sum3(dst, c, src)
	case 4:
		sum4(dst, c, src)
	}
}

func sum1(dst []byte, c uint64, src *[maskBatch][]byte) {
	n := len(dst) &^ 63
	k0 := src[0][:n]
	for i := 0; i < n; i += 64 {
		d := (*[64]byte)(dst[i:])
		s0 := (*[64]byte)(k0[i:])
		le.PutUint64(d[0:], le.Uint64(d[0:])+c+le.Uint64(s0[0:]))
		le.PutUint64(d[8:], le.Uint64(d[8:])+c+le.Uint64(s0[8:]))
		le.PutUint64(d[16:], le.Uint64(d[16:])+c+le.Uint64(s0[16:]))
		le.PutUint64(d[24:], le.Uint64(d[24:])+c+le.Uint64(s0[24:]))
		le.PutUint64(d[32:], le.Uint64(d[32:])+c+le.Uint64(s0[32:]))
		le.PutUint64(d[40:], le.Uint64(d[40:])+c+le.Uint64(s0[40:]))
		le.PutUint64(d[48:], le.Uint64(d[48:])+c+le.Uint64(s0[48:]))
		le.PutUint64(d[56:], le.Uint64(d[56:])+c+le.Uint64(s0[56:]))
	}
}

func sum2(dst []byte, c uint64, src *[maskBatch][]byte) {
	n := len(dst) &^ 63
	k0 := src[0][:n]
	k1 := src[1][:n]
	for i := 0; i < n; i += 64 {
		d := (*[64]byte)(dst[i:])
		s0, s1 := (*[64]byte)(k0[i:]), (*[64]byte)(k1[i:])
		le.PutUint64(d[0:], le.Uint64(d[0:])+c+le.Uint64(s0[0:])+le.Uint64(s1[0:]))
		le.PutUint64(d[8:], le.Uint64(d[8:])+c+le.Uint64(s0[8:])+le.Uint64(s1[8:]))
		le.PutUint64(d[16:], le.Uint64(d[16:])+c+le.Uint64(s0[16:])+le.Uint64(s1[16:]))
		le.PutUint64(d[24:], le.Uint64(d[24:])+c+le.Uint64(s0[24:])+le.Uint64(s1[24:]))
		le.PutUint64(d[32:], le.Uint64(d[32:])+c+le.Uint64(s0[32:])+le.Uint64(s1[32:]))
		le.PutUint64(d[40:], le.Uint64(d[40:])+c+le.Uint64(s0[40:])+le.Uint64(s1[40:]))
		le.PutUint64(d[48:], le.Uint64(d[48:])+c+le.Uint64(s0[48:])+le.Uint64(s1[48:]))
		le.PutUint64(d[56:], le.Uint64(d[56:])+c+le.Uint64(s0[56:])+le.Uint64(s1[56:]))
	}
}

func sum3(dst []byte, c uint64, src *[maskBatch][]byte) {
	n := len(dst) &^ 63
	k0 := src[0][:n]
	k1 := src[1][:n]
	k2 := src[2][:n]
	for i := 0; i < n; i += 64 {
		d := (*[64]byte)(dst[i:])
		s0, s1, s2 := (*[64]byte)(k0[i:]), (*[64]byte)(k1[i:]), (*[64]byte)(k2[i:])
		le.PutUint64(d[0:], le.Uint64(d[0:])+c+le.Uint64(s0[0:])+le.Uint64(s1[0:])+le.Uint64(s2[0:]))
		le.PutUint64(d[8:], le.Uint64(d[8:])+c+le.Uint64(s0[8:])+le.Uint64(s1[8:])+le.Uint64(s2[8:]))
		le.PutUint64(d[16:], le.Uint64(d[16:])+c+le.Uint64(s0[16:])+le.Uint64(s1[16:])+le.Uint64(s2[16:]))
		le.PutUint64(d[24:], le.Uint64(d[24:])+c+le.Uint64(s0[24:])+le.Uint64(s1[24:])+le.Uint64(s2[24:]))
		le.PutUint64(d[32:], le.Uint64(d[32:])+c+le.Uint64(s0[32:])+le.Uint64(s1[32:])+le.Uint64(s2[32:]))
		le.PutUint64(d[40:], le.Uint64(d[40:])+c+le.Uint64(s0[40:])+le.Uint64(s1[40:])+le.Uint64(s2[40:]))
		le.PutUint64(d[48:], le.Uint64(d[48:])+c+le.Uint64(s0[48:])+le.Uint64(s1[48:])+le.Uint64(s2[48:]))
		le.PutUint64(d[56:], le.Uint64(d[56:])+c+le.Uint64(s0[56:])+le.Uint64(s1[56:])+le.Uint64(s2[56:]))
	}
}

func sum4(dst []byte, c uint64, src *[maskBatch][]byte) {
	n := len(dst) &^ 63
	k0 := src[0][:n]
	k1 := src[1][:n]
	k2 := src[2][:n]
	k3 := src[3][:n]
	for i := 0; i < n; i += 64 {
		d := (*[64]byte)(dst[i:])
		s0, s1, s2, s3 := (*[64]byte)(k0[i:]), (*[64]byte)(k1[i:]), (*[64]byte)(k2[i:]), (*[64]byte)(k3[i:])
		le.PutUint64(d[0:], le.Uint64(d[0:])+c+le.Uint64(s0[0:])+le.Uint64(s1[0:])+le.Uint64(s2[0:])+le.Uint64(s3[0:]))
		le.PutUint64(d[8:], le.Uint64(d[8:])+c+le.Uint64(s0[8:])+le.Uint64(s1[8:])+le.Uint64(s2[8:])+le.Uint64(s3[8:]))
		le.PutUint64(d[16:], le.Uint64(d[16:])+c+le.Uint64(s0[16:])+le.Uint64(s1[16:])+le.Uint64(s2[16:])+le.Uint64(s3[16:]))
		le.PutUint64(d[24:], le.Uint64(d[24:])+c+le.Uint64(s0[24:])+le.Uint64(s1[24:])+le.Uint64(s2[24:])+le.Uint64(s3[24:]))
		le.PutUint64(d[32:], le.Uint64(d[32:])+c+le.Uint64(s0[32:])+le.Uint64(s1[32:])+le.Uint64(s2[32:])+le.Uint64(s3[32:]))
		le.PutUint64(d[40:], le.Uint64(d[40:])+c+le.Uint64(s0[40:])+le.Uint64(s1[40:])+le.Uint64(s2[40:])+le.Uint64(s3[40:]))
		le.PutUint64(d[48:], le.Uint64(d[48:])+c+le.Uint64(s0[48:])+le.Uint64(s1[48:])+le.Uint64(s2[48:])+le.Uint64(s3[48:]))
		le.PutUint64(d[56:], le.Uint64(d[56:])+c+le.Uint64(s0[56:])+le.Uint64(s1[56:])+le.Uint64(s2[56:])+le.Uint64(s3[56:]))
	}
}

var le = binary.LittleEndian

// A value vector of the 32-bit ring is carried as pairs: coordinates 2i
// and 2i+1, the signed integers a and b, are the one element a + 2^32·b
// of Z_2^64 at bytes [8i, 8i+8) (a last odd coordinate alone is a word of
// Z_2^32). Masks add to the pair as one 64-bit word, so the 32-bit ring
// costs what the 64-bit one does per byte. The sum stays exact under the
// same bound: with |Σa| and |Σb| at most 2^31 − 1, the low half of the
// summed word read as a signed 32-bit integer is Σa, and the high half
// of (word − Σa) is Σb (coordAt). Both halves of a masked pair are
// uniform, as a uniform element of Z_2^64 is.

// putCoords writes the ring images of v (integers; two's complement) as
// coordinates of width bytes at dst, the first of them at an even index.
func putCoords[T int64 | uint64](dst []byte, width int, v []T) {
	if width == 8 {
		dst = dst[:8*len(v)]
		for i, w := range v {
			le.PutUint64(dst[8*i:], uint64(w))
		}
		return
	}
	dst = dst[:4*len(v)]
	i := 0
	for ; i+1 < len(v); i += 2 {
		le.PutUint64(dst[4*i:], uint64(v[i])+uint64(v[i+1])<<32)
	}
	if i < len(v) {
		le.PutUint32(dst[4*i:], uint32(v[i]))
	}
}

// coordsAddTile is putCoords(dst, width, v) followed by sumWords(dst,
// c, src, k) in one pass (AVX2 where the CPU has it, coordsAddBulk;
// elsewhere and for the last values, the two steps while the tile is in
// L1): a DP round's input put on the ring with its first batch of masks.
func coordsAddTile(dst []byte, width int, v []int64, c uint64, src *[maskBatch][]byte, k int) {
	dst = dst[:width*len(v)]
	n := coordsAddBulk(dst, width, v, c, src, k)
	if n == len(v) {
		return
	}
	o := width * n
	putCoords(dst[o:], width, v[n:])
	var rest [maskBatch][]byte
	for j := range k {
		rest[j] = src[j][o:len(dst)]
	}
	sumWords(dst[o:], c, &rest, k)
}

// coordAt reads coordinate i of a summed vector of layout l as a signed
// integer: the exact sum whenever the round's bound holds
// (|sum| < 2^(8·width−1) in every coordinate).
func coordAt(vec []byte, l layout, i int) int64 {
	if l.width == 8 {
		return int64(le.Uint64(vec[8*i:]))
	}
	if i%2 == 0 && i+1 == l.vals {
		return int64(int32(le.Uint32(vec[4*i:])))
	}
	w := le.Uint64(vec[4*(i&^1):])
	a := int64(int32(uint32(w)))
	if i%2 == 0 {
		return a
	}
	return int64(int32(uint32((w - uint64(a)) >> 32)))
}

// weightAt reads the weight coordinate of a summed vector.
func weightAt(vec []byte, l layout) int64 { return int64(le.Uint64(vec[l.weightOff():])) }

// addVectors adds the ring vector in to acc (both in layout l), on all
// cores: the server's accumulation of a masked input.
func addVectors(acc, in []byte, l layout) {
	applyMasks(AESCTR, acc, l, nil, func(_ *scratch, vec []byte, lo, hi, _ int, c uint64, src *[maskBatch][]byte, k int) {
		if k == maskBatch { // no masks here, but fill's contract allows a full batch
			sumWords(vec[lo:hi], c, src, k)
			c, k = 0, 0
		}
		src[k] = in[lo:hi]
		sumWords(vec[lo:hi], c, src, k+1)
	})
}

// subWords is sumWords' inverse: it subtracts c and the words of
// src[:k] from dst (for a test's record of the plaintext).
func subWords(dst []byte, c uint64, src *[maskBatch][]byte, k int) {
	o := 0
	for ; o+8 <= len(dst); o += 8 {
		v := le.Uint64(dst[o:]) - c
		for _, s := range src[:k] {
			v -= le.Uint64(s[o:])
		}
		le.PutUint64(dst[o:], v)
	}
	if o+4 <= len(dst) {
		v := le.Uint32(dst[o:]) - uint32(c)
		for _, s := range src[:k] {
			v -= le.Uint32(s[o:])
		}
		le.PutUint32(dst[o:], v)
	}
}
