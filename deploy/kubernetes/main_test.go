package kubernetes

import (
	"fmt"
	"os"
	"testing"
)

// binDir holds the scellis binary the tests build (testbin.Scellis).
var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		var err error
		if binDir, err = os.MkdirTemp("", "scellis-k8s-test-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(binDir)
		return m.Run()
	}())
}
