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
	"testing"
)

var (
	once sync.Once
	dir  string // the test process's folder for the binary (Main)
	bin  string
	err  error
)

// Main runs a package's tests with a temporary folder for the binary,
// removed afterwards: func TestMain(m *testing.M) { os.Exit(testbin.Main(m)) }.
func Main(m *testing.M) int {
	var err error
	if dir, err = os.MkdirTemp("", "scellis-deploy-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	return m.Run()
}

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

// Scellis returns the path of the checkout's scellis binary, built on the
// first call into Main's folder.
func Scellis() (string, error) {
	once.Do(func() {
		var root string
		if root, err = Root(); err != nil {
			return
		}
		if dir == "" {
			err = fmt.Errorf("testbin.Scellis outside testbin.Main")
			return
		}
		// The release's flags (static, -trimpath): the packages built
		// next by the release program then compile nothing again.
		bin = filepath.Join(dir, "scellis")
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/scellis")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("go build ./cmd/scellis: %v\n%s", e, out)
		}
	})
	return bin, err
}

// PatientsCSV writes dir/patients.csv, a hospital's dataset as a silo's
// config names it, with bin's datagen (50 generated patient records).
func PatientsCSV(bin, dir string) error {
	if out, err := exec.Command(bin, "datagen", "hospitals", "--sites", "1", "--rows", "50", "--out", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("scellis datagen: %v\n%s", err, out)
	}
	return os.Rename(filepath.Join(dir, "hospital-1.csv"), filepath.Join(dir, "patients.csv"))
}
