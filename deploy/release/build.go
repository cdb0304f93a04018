package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// buildEnv is the environment of a release build: static (no cgo, so no C
// library to match on the target), the baseline instruction set of each
// architecture, and none of the caller's GOFLAGS or experiments, which
// would change the bytes. -buildvcs=false: the go command stamps VCS
// details only where it finds git and the checkout's .git (a clone, yes;
// a git worktree or a source tarball, no), so the same commit would give
// different binaries; the version stamped names the commit instead.
func buildEnv(arch string) []string {
	env := []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + arch, "GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly -buildvcs=false", "GOEXPERIMENT="}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "CGO_ENABLED", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "GOFLAGS", "GOEXPERIMENT":
		default:
			env = append(env, kv)
		}
	}
	return env
}

// buildBinary builds cmd/scellis for linux/arch into the output folder:
// -trimpath (no build paths in the binary), the version stamped into
// main.version, symbol tables stripped (stack traces keep their names).
func buildBinary(o options, arch string) (string, error) {
	out, err := filepath.Abs(filepath.Join(o.out, fmt.Sprintf("scellis_%s_linux_%s", fileVersion(o.version), arch)))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+o.version, "-o", out, "./cmd/scellis")
	cmd.Dir = o.root
	cmd.Env = buildEnv(arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build for linux/%s: %v\n%s", arch, err, b)
	}
	return out, nil
}
