//go:build !unix

package dp

import (
	"fmt"
	"os"
)

// lockFile refuses: a ledger needs flock, which only unix systems give.
// This build exists so the packages that import dp (through job and
// script) compile for GOOS=js, where the shard executor runs in a browser
// tab and never opens a ledger.
func lockFile(f *os.File, exclusive bool) (func(), error) {
	return nil, fmt.Errorf("dp: locking %s: file locks are not available on this platform", f.Name())
}
