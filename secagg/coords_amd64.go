//go:build amd64 && !purego

package secagg

// coordsAddAVX2 is coordsAddTile's bulk in AVX2 (coords_amd64.s); n is
// a multiple of 8.
//
//go:noescape
func coordsAddAVX2(dst *byte, v *int64, n int, width int, c uint64, s0, s1, s2, s3 *byte)

// coordsAddBulk writes as many coordinates of v as it can eight at a
// time (coordsAddTile's arguments) and returns how many. It takes the
// ring images of a DP round's integers about four times less time than
// putCoords and a separate addition (a third of the client's CPU at
// n = 3 in Z_2^32 went to putCoords).
func coordsAddBulk(dst []byte, width int, v []int64, c uint64, src *[maskBatch][]byte, k int) int {
	n := len(v) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	m := width * n
	_ = dst[m-1] // the assembly writes this far
	s := batchSources(src, k, m)
	coordsAddAVX2(&dst[0], &v[0], n, width, c, s[0], s[1], s[2], s[3])
	return n
}
