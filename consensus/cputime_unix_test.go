//go:build unix

package consensus

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used so far (all threads, user
// and system), and true. On a machine others share, CPU time per operation
// is steadier than wall time.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
