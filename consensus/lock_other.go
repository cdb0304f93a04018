//go:build !unix

package consensus

import (
	"os"
	"path/filepath"
)

// lockDir only creates dir/LOCK where flock is unavailable: a second node on
// the same directory is not detected there.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
}
