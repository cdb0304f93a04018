//go:build unix

package safefile

import "syscall"

const nonBlock = syscall.O_NONBLOCK
