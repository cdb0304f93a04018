package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// arMembers splits a .deb (an ar archive) into its members, in order.
func arMembers(t *testing.T, b []byte) (names []string, data map[string][]byte) {
	t.Helper()
	if !bytes.HasPrefix(b, []byte("!<arch>\n")) {
		t.Fatalf("not an ar archive: %q", b[:min(len(b), 8)])
	}
	data = map[string][]byte{}
	for off := 8; off < len(b); {
		if off+60 > len(b) {
			t.Fatalf("truncated ar header at %d", off)
		}
		hdr := b[off : off+60]
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[:16])), "/")
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[48:58])))
		if err != nil || off+60+size > len(b) {
			t.Fatalf("ar member %q: size %q", name, hdr[48:58])
		}
		names = append(names, name)
		data[name] = b[off+60 : off+60+size]
		off += 60 + size + size%2
	}
	return names, data
}

// tarGzFiles reads a .tar.gz into its headers and regular files' bytes.
func tarGzFiles(t *testing.T, b []byte) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	headers, files := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers, files
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		headers[name] = h
		if h.Typeflag == tar.TypeReg {
			if files[name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The .deb read back: Debian's member order, the control fields, every
// file where a Debian system looks for it (byte for byte the checkout's
// units, sysusers and tmpfiles entries, examples, and the binary), owned
// by root with the release's timestamp, and the maintainer scripts.
// dpkg-deb, where installed, reads it too. Two builds are identical.
func TestDebReadBack(t *testing.T) {
	o := outDir(t)
	p, err := writeDeb(o, runtime.GOARCH, testBin)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	names, members := arMembers(t, raw)
	if strings.Join(names, " ") != "debian-binary control.tar.gz data.tar.gz" || string(members["debian-binary"]) != "2.0\n" {
		t.Fatalf("ar members %v, debian-binary %q", names, members["debian-binary"])
	}
	_, control := tarGzFiles(t, members["control.tar.gz"])
	fields := string(control["/control"])
	wantVersion := debianVersion(testVersion) + "-1"
	for _, want := range []string{"Package: scellis\n", "Version: " + wantVersion + "\n", "Architecture: " + runtime.GOARCH + "\n", "Depends: systemd\n", "Section: net\n"} {
		if !strings.Contains(fields, want) {
			t.Errorf("control lacks %q:\n%s", want, fields)
		}
	}
	deploy := filepath.Join(o.root, "deploy")
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		want, _ := os.ReadFile(filepath.Join(deploy, "debian", s))
		if !bytes.Equal(control["/"+s], want) {
			t.Errorf("the package's %s is not deploy/debian/%s", s, s)
		}
	}

	headers, data := tarGzFiles(t, members["data.tar.gz"])
	bin, _ := os.ReadFile(testBin)
	want := map[string][]byte{
		"/usr/bin/scellis":                      bin,
		"/usr/lib/sysusers.d/scellis.conf":      read(t, deploy, "systemd", "scellis.sysusers.conf"),
		"/usr/lib/tmpfiles.d/scellis.conf":      read(t, deploy, "systemd", "scellis.tmpfiles.conf"),
		"/usr/share/doc/scellis/README.md":      read(t, deploy, "README.md"),
		"/usr/share/scellis/silo-trainers.conf": read(t, deploy, "systemd", "scellis-silo-trainers.conf"),
	}
	for _, r := range roles {
		want["/usr/lib/systemd/system/scellis-"+r+"@.service"] = read(t, deploy, "systemd", "scellis-"+r+"@.service")
		want["/usr/share/doc/scellis/examples/"+r+".yaml"] = read(t, deploy, "examples", r+".yaml")
	}
	for name, b := range want {
		h := headers[name]
		if h == nil {
			t.Errorf("the package has no %s", name)
			continue
		}
		mode := int64(0o644)
		if name == "/usr/bin/scellis" {
			mode = 0o755
		}
		if !bytes.Equal(data[name], b) || h.Mode&0o7777 != mode || h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(o.stamp.time) {
			t.Errorf("%s: %d bytes (want %d), mode %o (want %o), uid %d gid %d, mtime %v (want %v)", name, len(data[name]), len(b), h.Mode&0o7777, mode, h.Uid, h.Gid, h.ModTime, o.stamp.time)
		}
	}
	for name, h := range headers {
		if h.Typeflag == tar.TypeReg && want[name] == nil {
			t.Errorf("the package holds %s, which no test expects", name)
		}
	}

	if _, err := exec.LookPath("dpkg-deb"); err == nil {
		out, err := exec.Command("dpkg-deb", "--field", p, "Version", "Architecture").Output()
		if err != nil || string(out) != fmt.Sprintf("Version: %s\nArchitecture: %s\n", wantVersion, runtime.GOARCH) {
			t.Errorf("dpkg-deb --field: %q %v", out, err)
		}
	}

	again, err := writeDeb(outDir(t), runtime.GOARCH, testBin)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(again); !bytes.Equal(b, raw) {
		t.Fatal("two builds of the .deb differ")
	}
}

func read(t *testing.T, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(elem...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
