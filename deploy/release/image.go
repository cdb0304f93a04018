package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image's user: a fixed, unprivileged uid and gid (65532, the
// "nonroot" of distroless images), so that Kubernetes' runAsNonRoot can
// check it and volumes can be given to it by number (fsGroup).
const (
	imageUID  = 65532
	imageUser = "65532:65532"
)

// imageName is the name `docker load` and `podman load` give the image,
// tagged with the version.
const imageName = "scellis"

// imageFile is one entry of the image's only layer.
type imageFile struct {
	name     string // without a leading slash
	mode     int64  // permission bits (and sticky)
	dir      bool
	uid      int // owner and group
	contents []byte
}

// rootfs is the image's file system: the static binary, the CA roots (for
// outbound TLS that is not pinned to the federation's keys), passwd and
// group naming the user, and the folders the deployment mounts over:
// /etc/scellis (configs and keys, read-only), /var/lib/scellis (state,
// the user's), /srv/scellis (a silo's data, read-only), /tmp.
func rootfs(bin []byte) []imageFile {
	d := func(name string, mode int64, uid int) imageFile {
		return imageFile{name: name, mode: mode, dir: true, uid: uid}
	}
	f := func(name string, mode int64, b []byte) imageFile {
		return imageFile{name: name, mode: mode, contents: b}
	}
	return []imageFile{
		d("etc", 0o755, 0),
		f("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\nscellis:x:%d:\n", imageUID)),
		f("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nscellis:x:%d:%d:Scellis federated compute:/var/lib/scellis:/sbin/nologin\n", imageUID, imageUID)),
		d("etc/scellis", 0o755, 0),
		d("etc/ssl", 0o755, 0),
		d("etc/ssl/certs", 0o755, 0),
		f("etc/ssl/certs/ca-certificates.crt", 0o644, caBundle()),
		d("srv", 0o755, 0),
		d("srv/scellis", 0o755, 0),
		d("tmp", 0o1777, 0),
		d("usr", 0o755, 0),
		d("usr/bin", 0o755, 0),
		f("usr/bin/scellis", 0o755, bin),
		d("var", 0o755, 0),
		d("var/lib", 0o755, 0),
		d("var/lib/scellis", 0o700, imageUID),
	}
}

// caBundle is Mozilla's root store as PEM, from Go's x509roots module
// (pinned by go.sum, so the image does not depend on the building
// machine's certificates). Roots that carry a constraint PEM cannot hold
// (distrust after a date) are left out rather than trusted without it.
func caBundle() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return b.Bytes()
}

// layerTar writes files as a tar stream, every entry owned by root but
// for the ones given a uid, stamped with mtime.
func layerTar(files []imageFile, mtime time.Time) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.contents); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), tw.Close()
}

// imageConfig is how the image runs: `scellis ROLE --config
// /etc/scellis/NAME/ROLE.yaml` as the unprivileged user, state in
// /var/lib/scellis.
func imageConfig(o options, arch string) *v1.ConfigFile {
	c := &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: o.stamp.time},
		RootFS:       v1.RootFS{Type: "layers"}, // mutate.Append adds the layer's diff ID
		Config: v1.Config{
			Entrypoint:   []string{"/usr/bin/scellis"},
			Cmd:          []string{"--help"},
			User:         imageUser,
			WorkingDir:   "/var/lib/scellis",
			Env:          []string{"PATH=/usr/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			ExposedPorts: map[string]struct{}{"7400/tcp": {}, "7401/tcp": {}},
			Volumes:      map[string]struct{}{"/var/lib/scellis": {}},
			StopSignal:   "SIGTERM",
			Labels: map[string]string{
				"org.opencontainers.image.title":    "scellis",
				"org.opencontainers.image.version":  o.version,
				"org.opencontainers.image.source":   "https://github.com/scellis/scellis",
				"org.opencontainers.image.revision": o.stamp.commit,
				"org.opencontainers.image.created":  o.stamp.time.Format(time.RFC3339),
			},
		},
	}
	if arch == "arm64" {
		c.Variant = "v8"
	}
	return c
}

// buildImage makes the image for arch around the binary: one layer, OCI
// media types, every timestamp o's.
func buildImage(o options, arch string, bin []byte) (v1.Image, error) {
	layerBytes, err := layerTar(rootfs(bin), o.stamp.time)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.ConfigFile(img, imageConfig(o, arch)); err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: o.stamp.time}, CreatedBy: "scellis release " + o.version, Comment: "the static scellis binary, CA roots, the scellis user"},
	})
}

// writeImage writes the image for arch as OUT/scellis_VERSION_linux_ARCH.oci.tar.
func writeImage(o options, arch, binPath string) (string, error) {
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return "", err
	}
	img, err := buildImage(o, arch, bin)
	if err != nil {
		return "", fmt.Errorf("image for %s: %w", arch, err)
	}
	p := filepath.Join(o.out, fmt.Sprintf("scellis_%s_linux_%s.oci.tar", fileVersion(o.version), arch))
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	if err := writeArchive(f, img, fileVersion(o.version), o.stamp.time); err != nil {
		f.Close()
		return "", fmt.Errorf("image for %s: %w", arch, err)
	}
	return p, f.Close()
}
