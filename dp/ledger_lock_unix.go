//go:build unix

package dp

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockFile takes a flock on f and returns the function that releases it.
func lockFile(f *os.File, exclusive bool) (func(), error) {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err == nil {
			break
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return nil, fmt.Errorf("dp: locking %s: %w", f.Name(), err)
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN) }, nil
}
