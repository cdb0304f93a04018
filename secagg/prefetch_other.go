//go:build !amd64 || purego

package secagg

// prefetchBytes does nothing here: the hardware prefetcher alone.
func prefetchBytes(b []byte) {}
