//go:build !amd64 || purego

package secagg

// roundBulk does nothing here: encodeTile's Go loops encode every value.
func roundBulk(dst []byte, width int, x []float64, scale float64, draws []byte) (done int, tie bool) {
	return 0, false
}

// roundAddBulk does nothing here: encodeAddTile encodes, then adds.
func roundAddBulk(dst []byte, width int, x []float64, scale float64, draws []byte, c uint64, src *[maskBatch][]byte, k int) (done int, tie bool) {
	return 0, false
}

// coordsAddBulk does nothing here: coordsAddTile writes, then adds.
func coordsAddBulk(dst []byte, width int, v []int64, c uint64, src *[maskBatch][]byte, k int) int {
	return 0
}
