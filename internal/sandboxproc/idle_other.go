//go:build !linux

package sandboxproc

// idleThread does nothing where there is no SCHED_IDLE: the niceness
// (lowerPriority) is all there is.
func idleThread(int) {}
