// Package safefile opens and reads the files a user names — configs, job
// specs, datasets, ledgers, receipt files, keys — without letting the path
// hang or exhaust the process. Its invariant: a file is read only after the
// open descriptor itself was checked to be a regular file no larger than the
// caller's bound, and never more than that bound is read, so a FIFO, a
// device such as /dev/zero, a directory or a file that grows while it is read
// is refused instead of blocking or filling memory.
//
// Errors wrap ErrNotRegular or ErrTooLarge (or the os error), so callers turn
// them into their own diagnostic code with the message as the reason.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

var (
	// ErrNotRegular: the path names a FIFO, device, socket or directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file is larger than the caller's bound.
	ErrTooLarge = errors.New("file too large")
)

// Common bounds for the kinds of file Scellis reads.
const (
	// MaxConfig bounds configs, job and run specs and federation files.
	MaxConfig = 1 << 20
	// MaxKey bounds key files.
	MaxKey = 64 << 10
	// MaxDataset bounds one CSV dataset.
	MaxDataset = 1 << 30
	// MaxLedger bounds a privacy ledger or an exported receipt chain.
	MaxLedger = 1 << 30
)

// Open opens path with flag (os.O_RDONLY, os.O_RDWR, …; never O_CREATE) and
// returns it only when it is a regular file of at most max bytes. The open
// itself cannot block: a FIFO is opened non-blocking and then refused.
func Open(path string, flag int, max int64) (*os.File, fs.FileInfo, error) {
	// O_NONBLOCK makes opening a FIFO return at once instead of waiting for
	// a writer; on a regular file it has no effect on reads and writes.
	f, err := os.OpenFile(path, flag|nonBlock, 0)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if err := Check(path, st, max); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// Check refuses st unless it describes a regular file of at most max bytes.
func Check(path string, st fs.FileInfo, max int64) error {
	if !st.Mode().IsRegular() {
		return &fs.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w (it is %s)", ErrNotRegular, kind(st.Mode()))}
	}
	if st.Size() > max {
		return &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: %d bytes, the limit is %s", ErrTooLarge, st.Size(), Size(max))}
	}
	return nil
}

// ReadFile reads a whole regular file of at most max bytes.
func ReadFile(path string, max int64) ([]byte, error) {
	f, _, err := Open(path, os.O_RDONLY, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadAll(f, path, max)
}

// ReadAll reads f to its end, refusing to go past max bytes (a file that
// grew after it was checked).
func ReadAll(f io.Reader, path string, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: it holds more than %s", ErrTooLarge, Size(max))}
	}
	return b, nil
}

// Size renders a byte bound for a message: "1 MiB", "64 KiB", "1000 bytes".
func Size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "not a regular file"
}
