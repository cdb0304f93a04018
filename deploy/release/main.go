// Command release builds Scellis's release artefacts from a checkout in one
// command, for linux/amd64 and linux/arm64:
//
//	go -C deploy run ./release -version v0.2.0
//
// writes to deploy/dist: static binaries (CGO_ENABLED=0, -trimpath, the
// version stamped), a .deb per architecture (binary, templated systemd
// units, sysusers and tmpfiles entries, config examples), an OCI image
// archive per architecture (from scratch: the binary, CA roots, a non-root
// user; `docker load` and `podman load` take it) and SHA256SUMS.
//
// Invariant: the artefacts are reproducible. The same commit, version and
// Go toolchain give the same bytes: every timestamp is SOURCE_DATE_EPOCH
// or the commit's time, every archive is written in a fixed order with
// fixed owners, and nothing is read from the building machine but the
// checkout (the CA roots come from a Go module, pinned by go.sum).
//
// It lives in its own module (deploy/go.mod) so that the packaging
// libraries it uses (nfpm, go-containerregistry, the Kubernetes API types
// the manifests are checked with) never enter the dependency graph of the
// scellis binary that hospitals run.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// options is one release: what to build and where.
type options struct {
	root       string    // the checkout: the folder of module github.com/scellis/scellis
	out        string    // where the artefacts go
	version    string    // stamped into the binary (main.version), e.g. v0.2.0
	arches     []string  // GOARCH values
	maintainer string    // the .deb's Maintainer field
	stamp      buildTime // every timestamp the artefacts carry
}

// arches the release builds by default.
var defaultArches = []string{"amd64", "arm64"}

// errUsage marks refused flags (exit code 2).
var errUsage = errors.New("usage")

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "release: error: %v\n", err)
		os.Exit(2)
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "release: error: %v\n", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var arches string
	fs.StringVar(&o.root, "root", "", "the Scellis checkout (default: found above the current folder)")
	fs.StringVar(&o.out, "out", "", "folder for the artefacts (default: ROOT/deploy/dist)")
	fs.StringVar(&o.version, "version", "", "version to stamp, e.g. v0.2.0 (default: git describe, or a pseudo-version of the commit)")
	fs.StringVar(&arches, "arch", strings.Join(defaultArches, ","), "architectures to build, comma-separated: amd64, arm64")
	fs.StringVar(&o.maintainer, "maintainer", "Scellis maintainers <maintainers@scellis.invalid>", "the .deb's Maintainer field")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected argument %q (flags only)", errUsage, fs.Arg(0))
	}
	for a := range strings.SplitSeq(arches, ",") {
		if a != "amd64" && a != "arm64" {
			return o, fmt.Errorf("%w: -arch %q: each architecture must be amd64 or arm64", errUsage, a)
		}
		o.arches = append(o.arches, a)
	}
	var err error
	if o.root == "" {
		if o.root, err = findRoot("."); err != nil {
			return o, err
		}
	}
	if o.out == "" {
		o.out = filepath.Join(o.root, "deploy", "dist")
	}
	if o.version == "" {
		if o.version, err = gitVersion(o.root); err != nil {
			return o, err
		}
	}
	if err := checkVersion(o.version); err != nil {
		return o, fmt.Errorf("%w: -version %q: %v", errUsage, o.version, err)
	}
	o.stamp, err = sourceDate(o.root)
	return o, err
}

// run builds every artefact of o, then SHA256SUMS over them.
func run(o options, w io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(w, "release %s (%s), timestamps %s\n", o.version, goVersion(), o.stamp.time.Format("2006-01-02T15:04:05Z"))
	var made []string
	for _, arch := range o.arches {
		bin, err := buildBinary(o, arch)
		if err != nil {
			return err
		}
		deb, err := writeDeb(o, arch, bin)
		if err != nil {
			return err
		}
		img, err := writeImage(o, arch, bin)
		if err != nil {
			return err
		}
		made = append(made, bin, deb, img)
	}
	sums, err := writeChecksums(o.out, made)
	if err != nil {
		return err
	}
	for _, p := range append(made, sums) {
		fmt.Fprintf(w, "  %s\n", p)
	}
	return nil
}

// findRoot walks up from dir to the folder whose go.mod declares the
// scellis module.
func findRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/scellis/scellis\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("%w: no Scellis checkout above %s (give -root)", errUsage, dir)
		}
	}
}
