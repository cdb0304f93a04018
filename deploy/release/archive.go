package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// writeArchive writes img as one tar that both loaders read: an OCI image
// layout (oci-layout, index.json, blobs/sha256/…), which podman load,
// skopeo, umoci and docker load (25 and later) take, plus the
// docker-archive manifest.json pointing at the same blobs, which older
// docker load takes. The index names the image scellis:TAG for each of
// them: org.opencontainers.image.ref.name (podman, skopeo, umoci),
// io.containerd.image.name (docker on containerd), RepoTags (docker's
// classic store).
func writeArchive(w io.Writer, img v1.Image, tag string, mtime time.Time) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	ref := imageName + ":" + tag
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Size:      int64(len(manifest)),
			Digest:    digest,
			Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": ref,
				"io.containerd.image.name":          "docker.io/library/" + ref,
			},
		}},
	})
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	docker := []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: blob(cfgName), RepoTags: []string{ref}}}
	blobs := []archiveEntry{{blob(digest), manifest}, {blob(cfgName), config}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		b, err := readAll(l.Compressed())
		if err != nil {
			return err
		}
		docker[0].Layers = append(docker[0].Layers, blob(d))
		blobs = append(blobs, archiveEntry{blob(d), b})
	}
	dockerManifest, err := json.Marshal(docker)
	if err != nil {
		return err
	}
	entries := []archiveEntry{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{"blobs/", nil},
		{"blobs/sha256/", nil},
	}
	return writeTar(w, append(entries, blobs...), mtime)
}

// archiveEntry is a file of the archive, or a folder when its name ends
// in a slash.
type archiveEntry struct {
	name string
	data []byte
}

func writeTar(w io.Writer, entries []archiveEntry, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if e.name[len(e.name)-1] == '/' {
			h.Mode, h.Typeflag = 0o755, tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func readAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(rc)
	return b.Bytes(), err
}
