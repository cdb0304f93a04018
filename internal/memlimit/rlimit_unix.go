//go:build unix

package memlimit

import (
	"math"
	"syscall"
)

// addressSpaceLimit is RLIMIT_AS's soft value, and whether one is set.
func addressSpaceLimit() (int64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &rl); err != nil || rl.Cur >= math.MaxInt64 { // RLIM_INFINITY is all ones
		return 0, false
	}
	return int64(rl.Cur), true
}
