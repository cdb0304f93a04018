//go:build unix

package he

import (
	"syscall"
	"time"
)

// cpuNow is the CPU time the process has used so far (all threads, user
// and system): the benchmarks time phases in CPU, not wall time, so that
// a busy machine does not inflate them.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
