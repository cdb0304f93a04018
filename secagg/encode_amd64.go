//go:build amd64 && !purego

package secagg

// encodeAVX2 is encodeTile's bulk in AVX2 (encode_amd64.s), four values
// at a time, bit for bit the Go loop's arithmetic; n is a multiple of 4.
//
//go:noescape
func encodeAVX2(dst *byte, x *float64, draws *byte, n int, scale float64, width int) (ties int)

// roundBulk encodes as many values of x as it can four at a time
// (encodeTile's arguments), with ties rounded down, and returns how many
// it did and whether any tied. In AVX2 the encoding takes about half the
// time of the Go loop (~1 ns a value against ~2 on this kind of core).
func roundBulk(dst []byte, width int, x []float64, scale float64, draws []byte) (done int, tie bool) {
	n := len(x) &^ 3
	if !hasAVX2 || n == 0 {
		return 0, false
	}
	_, _ = dst[width*n-1], draws[roundBytes*n-1] // the assembly writes and reads this far
	return n, encodeAVX2(&dst[0], &x[0], &draws[0], n, scale, width) != 0
}

// encodeAddAVX2 is encodeAVX2 that adds c and the words of s0 … s3 at
// the same offsets to each encoded word before storing it (the sources
// a batch of keystream tiles, or zeroChunk where the batch is short).
//
//go:noescape
func encodeAddAVX2(dst *byte, x *float64, draws *byte, n int, scale float64, width int, c uint64, s0, s1, s2, s3 *byte) (ties int)

// roundAddBulk is roundBulk adding c and src[:k] (encodeAddTile's
// arguments) as it stores: the tile's one pass for its encoding and
// first masks.
func roundAddBulk(dst []byte, width int, x []float64, scale float64, draws []byte, c uint64, src *[maskBatch][]byte, k int) (done int, tie bool) {
	n := len(x) &^ 3
	if !hasAVX2 || n == 0 {
		return 0, false
	}
	m := width * n
	_, _ = dst[m-1], draws[roundBytes*n-1] // the assembly writes and reads this far
	s := batchSources(src, k, m)
	return n, encodeAddAVX2(&dst[0], &x[0], &draws[0], n, scale, width, c, s[0], s[1], s[2], s[3]) != 0
}

// batchSources points the assembly's four source arguments at the first m
// bytes of src[:k], and the rest at zeroChunk (which adds nothing; a tile
// is at most tileBytes), so a short batch runs the same code.
func batchSources(src *[maskBatch][]byte, k, m int) [maskBatch]*byte {
	var s [maskBatch]*byte
	for i := range s {
		if i < k {
			s[i] = &src[i][:m][0]
		} else {
			s[i] = &zeroChunk[:m][0]
		}
	}
	return s
}
