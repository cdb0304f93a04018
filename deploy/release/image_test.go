package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// writeTestImage writes the image archive for this machine's
// architecture and returns its path and the tag it carries.
func writeTestImage(t *testing.T) (string, string) {
	t.Helper()
	o := outDir(t)
	p, err := writeImage(o, runtime.GOARCH, testBin)
	if err != nil {
		t.Fatal(err)
	}
	return p, fileVersion(o.version)
}

// The archive the read-only tests share: written once (compressing the
// binary takes seconds).
var shared struct {
	once      sync.Once
	path, tag string
	err       error
}

func sharedImage(t *testing.T) (string, string) {
	t.Helper()
	shared.once.Do(func() {
		o := testOpts // TestMain's folder outlives every test
		shared.path, shared.err = writeImage(o, runtime.GOARCH, testBin)
		shared.tag = fileVersion(o.version)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.path, shared.tag
}

// untar unpacks a tar file into dir (regular files and folders only:
// what the archive and the layer hold).
func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			t.Fatalf("entry %q leaves the folder", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("entry %q has type %c", h.Name, h.Typeflag)
		}
	}
}

// The image archive read back as an OCI layout and as a docker archive
// (the two ways the loaders read it): one valid image (every digest and
// size checked), its config (entrypoint, non-root user, state folder),
// its one layer's files, and the binary taken out of the layer runs and
// says the release's version.
func TestImageArchiveReadBack(t *testing.T) {
	archive, tag := sharedImage(t)
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	untar(t, f, dir)
	f.Close()

	// As an OCI image layout: the index names the image and its platform.
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Annotations["org.opencontainers.image.ref.name"] != "scellis:"+tag ||
		desc.Annotations["io.containerd.image.name"] != "docker.io/library/scellis:"+tag ||
		desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != runtime.GOARCH ||
		desc.MediaType != types.OCIManifestSchema1 {
		t.Fatalf("index.json's manifest: %+v (platform %+v)", desc, desc.Platform)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("the OCI image does not validate: %v", err)
	}
	checkImageConfig(t, img)

	// As a docker archive (manifest.json): the same image.
	dimg, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(dimg); err != nil {
		t.Fatalf("the docker archive does not validate: %v", err)
	}
	cn, _ := img.ConfigName()
	dcn, _ := dimg.ConfigName()
	if cn != dcn {
		t.Fatalf("the docker archive's config is %s, the OCI layout's %s", dcn, cn)
	}
	var dm []struct{ RepoTags []string }
	b, _ := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err := json.Unmarshal(b, &dm); err != nil || len(dm) != 1 || len(dm[0].RepoTags) != 1 || dm[0].RepoTags[0] != "scellis:"+tag {
		t.Fatalf("manifest.json: %s (%v)", b, err)
	}

	// The layer's files, and the binary run from it.
	root := t.TempDir()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	headers := layerHeaders(t, layers[0], root)
	checkLayer(t, headers, root)
	bin := filepath.Join(root, "usr", "bin", "scellis")
	checkStatic(t, bin)
	if out := runBin(t, bin, "version"); out != "scellis "+testVersion+"\n" {
		t.Fatalf("the image's scellis version: %q", out)
	}
	// The entrypoint with a command, as `docker run IMAGE version` runs it.
	cf, _ := img.ConfigFile()
	entry := filepath.Join(root, strings.TrimPrefix(cf.Config.Entrypoint[0], "/"))
	if out := runBin(t, entry, "version"); !strings.HasPrefix(out, "scellis ") {
		t.Fatalf("the entrypoint: %q", out)
	}
}

// checkImageConfig: the config runs the binary as the non-root user, with
// its state folder, as Kubernetes and compose expect.
func checkImageConfig(t *testing.T, img v1.Image) {
	t.Helper()
	mt, _ := img.MediaType()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if mt != types.OCIManifestSchema1 || cf.OS != "linux" || cf.Architecture != runtime.GOARCH || cf.RootFS.Type != "layers" ||
		len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/bin/scellis" || c.User != "65532:65532" ||
		c.WorkingDir != "/var/lib/scellis" || c.Labels["org.opencontainers.image.version"] != testVersion ||
		cf.Created.Time != testOpts.stamp.time {
		t.Fatalf("image config (manifest %s): %+v", mt, cf)
	}
	if _, ok := c.Volumes["/var/lib/scellis"]; !ok {
		t.Errorf("the image declares no volume for /var/lib/scellis: %v", c.Volumes)
	}
}

// layerHeaders unpacks the layer into root and returns its entries by name.
func layerHeaders(t *testing.T, l v1.Layer, root string) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	untar(t, bytes.NewReader(b), root)
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers
		}
		if err != nil {
			t.Fatal(err)
		}
		headers[strings.TrimSuffix(h.Name, "/")] = h
	}
}

// checkLayer: the files the image promises, their owners and modes; the CA
// roots parse; passwd names the user the config runs as.
func checkLayer(t *testing.T, headers map[string]*tar.Header, root string) {
	t.Helper()
	for name, want := range map[string]struct {
		mode int64
		uid  int
	}{
		"usr/bin/scellis": {0o755, 0}, "etc/ssl/certs/ca-certificates.crt": {0o644, 0}, "etc/passwd": {0o644, 0},
		"var/lib/scellis": {0o700, 65532}, "etc/scellis": {0o755, 0}, "srv/scellis": {0o755, 0}, "tmp": {0o1777, 0},
	} {
		h := headers[name]
		if h == nil {
			t.Errorf("the layer has no %s", name)
			continue
		}
		if h.Mode != want.mode || h.Uid != want.uid || h.Gid != want.uid || !h.ModTime.Equal(testOpts.stamp.time) {
			t.Errorf("%s: mode %o uid %d gid %d mtime %v, want %o %d %d %v", name, h.Mode, h.Uid, h.Gid, h.ModTime, want.mode, want.uid, want.uid, testOpts.stamp.time)
		}
	}
	pemBytes, _ := os.ReadFile(filepath.Join(root, "etc", "ssl", "certs", "ca-certificates.crt"))
	n := 0
	for rest := pemBytes; ; n++ {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			t.Fatalf("CA root %d: %v", n, err)
		}
	}
	if n < 100 {
		t.Errorf("the CA bundle holds %d roots, want Mozilla's (over 100)", n)
	}
	if passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd")); !strings.Contains(string(passwd), "\nscellis:x:65532:65532:") {
		t.Errorf("etc/passwd does not name the image's user:\n%s", passwd)
	}
}

// checkStatic: the binary needs no loader and no shared library, so it
// runs in an image with nothing else.
func checkStatic(t *testing.T, bin string) {
	t.Helper()
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s asks for a program interpreter: not static", bin)
		}
	}
	if libs, _ := ef.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("%s needs shared libraries %v", bin, libs)
	}
}

// The same inputs give the same archive, byte for byte.
func TestImageReproducible(t *testing.T) {
	a, _ := sharedImage(t)
	b, _ := writeTestImage(t)
	sa, err := fileSHA256(a)
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := fileSHA256(b); sa != sb {
		t.Fatalf("two builds of the image differ: %s and %s", sa, sb)
	}
}

// Debian's own OCI tools read the archive where they are installed:
// skopeo as an oci-archive and as a docker-archive (the two formats
// podman and docker load), podman load itself (into a store of the
// test's), umoci by unpacking it into a runtime bundle whose process runs
// the binary as the image's user.
func TestImageArchiveDebianTools(t *testing.T) {
	archive, tag := sharedImage(t)
	t.Run("skopeo", func(t *testing.T) {
		if _, err := exec.LookPath("skopeo"); err != nil {
			t.Skip("skopeo is not installed (apt-get install skopeo)")
		}
		for _, transport := range []string{"oci-archive:", "docker-archive:"} {
			out, err := exec.Command("skopeo", "inspect", "--config", transport+archive).Output()
			if err != nil {
				t.Fatalf("skopeo inspect --config %s: %v %s", transport, err, stderrOf(err))
			}
			var cf v1.ConfigFile
			if err := json.Unmarshal(out, &cf); err != nil || cf.Config.User != "65532:65532" || cf.Config.Entrypoint[0] != "/usr/bin/scellis" || cf.Architecture != runtime.GOARCH {
				t.Fatalf("skopeo's view of %s: %s (%v)", transport, out, err)
			}
		}
	})
	t.Run("podman", func(t *testing.T) {
		if _, err := exec.LookPath("podman"); err != nil {
			t.Skip("podman is not installed (apt-get install podman)")
		}
		// podman load into a store of the test's own (vfs: no mounts),
		// removed afterwards.
		dir, err := os.MkdirTemp("/tmp", "podman-") // podman wants a runroot under 50 characters
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		podman := func(args ...string) ([]byte, error) {
			return exec.Command("podman", append([]string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
				"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none"}, args...)...).CombinedOutput()
		}
		t.Cleanup(func() { podman("system", "reset", "--force") })
		if out, err := podman("load", "-i", archive); err != nil || !strings.Contains(string(out), "Loaded image: docker.io/library/scellis:"+tag) {
			t.Fatalf("podman load: %v\n%s", err, out)
		}
		out, err := podman("image", "inspect", "--format", "{{.Config.User}} {{.Config.Entrypoint}} {{.Architecture}}", "scellis:"+tag)
		if want := "65532:65532 [/usr/bin/scellis] " + runtime.GOARCH + "\n"; err != nil || string(out) != want {
			t.Fatalf("podman image inspect: %q (%v), want %q", out, err, want)
		}
	})
	t.Run("umoci", func(t *testing.T) {
		if _, err := exec.LookPath("umoci"); err != nil {
			t.Skip("umoci is not installed (apt-get install umoci)")
		}
		dir := t.TempDir()
		f, err := os.Open(archive)
		if err != nil {
			t.Fatal(err)
		}
		os.Mkdir(filepath.Join(dir, "layout"), 0o755)
		untar(t, f, filepath.Join(dir, "layout"))
		f.Close()
		bundle := filepath.Join(dir, "bundle")
		if out, err := exec.Command("umoci", "unpack", "--rootless", "--image", filepath.Join(dir, "layout")+":scellis:"+tag, bundle).CombinedOutput(); err != nil {
			t.Fatalf("umoci unpack: %v\n%s", err, out)
		}
		var spec struct {
			Process struct {
				User struct{ UID, GID int }
				Args []string
				Cwd  string
			}
		}
		b, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err := json.Unmarshal(b, &spec); err != nil || spec.Process.User.UID != 65532 || spec.Process.User.GID != 65532 ||
			strings.Join(spec.Process.Args, " ") != "/usr/bin/scellis --help" || spec.Process.Cwd != "/var/lib/scellis" {
			t.Fatalf("umoci's runtime config: %+v (%v)", spec.Process, err)
		}
		if out := runBin(t, filepath.Join(bundle, "rootfs", "usr", "bin", "scellis"), "version"); out != "scellis "+testVersion+"\n" {
			t.Fatalf("the unpacked scellis version: %q", out)
		}
	})
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
