package sandboxproc

import (
	"syscall"
	"unsafe"
)

// schedIdle is Linux's SCHED_IDLE scheduling policy.
const schedIdle = 5

// idleThread puts thread tid under SCHED_IDLE: it runs only on a core no
// other thread wants, and a thread that wakes there takes the core from it
// at once. A niceness alone lowers only a thread's share: a round's step
// waking on a core busy with a nice-19 generic shard still waited for the
// shard's time slice to end, at every hop of the step
// (BenchmarkSharedSilos). A thread takes its creator's policy, as its
// niceness. Best effort: a kernel that refuses it leaves the niceness.
func idleThread(tid int) {
	var param struct{ priority int32 }
	_, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(tid), schedIdle, uintptr(unsafe.Pointer(&param)))
}
