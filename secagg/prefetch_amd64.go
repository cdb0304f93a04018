//go:build amd64 && !purego

package secagg

// prefetch asks the CPU to bring the lines of b into cache.
func prefetchBytes(b []byte) {
	if len(b) > 0 {
		prefetch(&b[0], len(b))
	}
}

//go:noescape
func prefetch(p *byte, n int)
