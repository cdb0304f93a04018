package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// testVersion is stamped into the binary the tests build.
const testVersion = "v0.9.1-test.1"

// The binary every test packages: built once, as the release builds it,
// for this machine's architecture (so the tests can run it).
var (
	testOpts options
	testBin  string
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "scellis-release-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if testOpts, err = parseFlags([]string{"-version", testVersion, "-out", dir, "-arch", runtime.GOARCH}, io.Discard); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if testBin, err = buildBinary(testOpts, runtime.GOARCH); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// outDir gives a test its own output folder with the shared options.
func outDir(t *testing.T) options {
	o := testOpts
	o.out = t.TempDir()
	return o
}

// runBin runs the release binary and returns its standard output.
func runBin(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, ee.Stderr)
		}
		t.Fatalf("%s %v: %v", filepath.Base(bin), args, err)
	}
	return string(out)
}

// Refused flags are usage errors (exit code 2), each saying what is wrong.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-arch", "amd64,386"}, `-arch "386": each architecture must be amd64 or arm64`},
		{[]string{"-version", "latest"}, `-version "latest": not a semantic version`},
		{[]string{"-version", "v1.2"}, `not a semantic version`},
		{[]string{"-version", "v1.0.0", "extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseFlags(c.args, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q): %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}

// Versions map to Debian versions that sort as semantic versions do (a
// pre-release before its release) and to file names and image tags.
func TestVersionMapping(t *testing.T) {
	for _, c := range []struct{ in, deb, file string }{
		{"v0.2.0", "0.2.0", "0.2.0"},
		{"0.2.0-rc.1", "0.2.0~rc.1", "0.2.0-rc.1"},
		{"0.0.0-20261201120000-abcdef123456+dirty", "0.0.0~20261201120000.abcdef123456+dirty", "0.0.0-20261201120000-abcdef123456-dirty"},
	} {
		if d, f := debianVersion(c.in), fileVersion(c.in); d != c.deb || f != c.file {
			t.Errorf("%s: Debian %q file %q, want %q %q", c.in, d, f, c.deb, c.file)
		}
	}
	if gitVersion, err := gitVersion(testOpts.root); err != nil || checkVersion(gitVersion) != nil {
		t.Errorf("the checkout's own version %q (%v) is not one -version accepts", gitVersion, err)
	}
	// dpkg agrees that the mapping keeps the order.
	if _, err := exec.LookPath("dpkg"); err == nil {
		for _, pair := range [][2]string{{"0.2.0-rc.1", "0.2.0"}, {"0.0.0-20261201120000-abcdef123456", "0.1.0"}} {
			if err := exec.Command("dpkg", "--compare-versions", debianVersion(pair[0]), "lt", debianVersion(pair[1])).Run(); err != nil {
				t.Errorf("dpkg does not sort %s before %s", debianVersion(pair[0]), debianVersion(pair[1]))
			}
		}
	}
}

// SHA256SUMS is what sha256sum -c checks: one line per file, sorted by
// name.
func TestChecksums(t *testing.T) {
	o := outDir(t)
	a, b := filepath.Join(o.out, "b.bin"), filepath.Join(o.out, "a.bin")
	os.WriteFile(a, []byte("scellis\n"), 0o644)
	os.WriteFile(b, nil, 0o644)
	sums, err := writeChecksums(o.out, []string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(sums)
	want := fmt.Sprintf("%x  a.bin\n%x  b.bin\n", sha256.Sum256(nil), sha256.Sum256([]byte("scellis\n")))
	if string(got) != want {
		t.Fatalf("SHA256SUMS:\n%s\nwant:\n%s", got, want)
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
		cmd.Dir = o.out
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("sha256sum -c: %v\n%s", err, out)
		}
	}
}

// The release binary is built the reproducible way, as its build info
// records: static, -trimpath, no VCS details (which depend on where the
// checkout is and how it was made); no path of the checkout is in it; and
// it says the version stamped.
func TestBinaryBuildInfo(t *testing.T) {
	info, err := buildinfo.ReadFile(testBin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" || settings["GOOS"] != "linux" {
		t.Errorf("build settings %v", settings)
	}
	for k := range settings {
		if strings.HasPrefix(k, "vcs") {
			t.Errorf("the binary records %s=%s: its bytes depend on the checkout", k, settings[k])
		}
	}
	if b, _ := os.ReadFile(testBin); bytes.Contains(b, []byte(testOpts.root)) {
		t.Errorf("the binary holds the checkout's path %s", testOpts.root)
	}
	if out := runBin(t, testBin, "version"); out != "scellis "+testVersion+"\n" {
		t.Errorf("scellis version: %q", out)
	}
}
