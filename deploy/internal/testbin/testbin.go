// Package testbin builds the scellis binary of the checkout for the
// deploy module's tests, which run what a user runs (federation init,
// config check) against the manifests and files they ship. The binary is
// built once per test process; the checkout is the folder above deploy/.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var (
	once sync.Once
	bin  string
	err  error
)

// Root is the checkout: the folder holding deploy/, found from the
// current folder (a test runs in its package's folder).
func Root() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; filepath.Dir(d) != d; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "deploy", "go.mod")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no checkout with deploy/go.mod above %s", wd)
}

// Scellis returns the path of the checkout's scellis binary, built into a
// folder of dir's on the first call (dir must outlive every caller: a
// TestMain's temporary folder).
func Scellis(dir string) (string, error) {
	once.Do(func() {
		var root string
		if root, err = Root(); err != nil {
			return
		}
		bin = filepath.Join(dir, "scellis")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/scellis")
		cmd.Dir = root
		if out, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("go build ./cmd/scellis: %v\n%s", e, out)
		}
	})
	return bin, err
}
