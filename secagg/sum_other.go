//go:build !amd64 || purego

package secagg

// sumBulk is sumWords' bulk: the first len(dst) &^ 63 bytes.
func sumBulk(dst []byte, c uint64, src *[maskBatch][]byte, k int) {
	sumBulkGo(dst, c, src, k)
}
