//go:build !unix

package memlimit

// addressSpaceLimit: no address-space limit outside Unix (the volunteer
// page's WebAssembly worker, which the browser bounds itself).
func addressSpaceLimit() (int64, bool) { return 0, false }
