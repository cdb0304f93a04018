package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// writeChecksums writes dir/SHA256SUMS over files, in the format
// `sha256sum -c` reads (hash, two spaces, name), sorted by name.
func writeChecksums(dir string, files []string) (string, error) {
	var lines []string
	for _, f := range files {
		sum, err := fileSHA256(f)
		if err != nil {
			return "", err
		}
		lines = append(lines, sum+"  "+filepath.Base(f)+"\n")
	}
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(a[66:], b[66:]) })
	p := filepath.Join(dir, "SHA256SUMS")
	return p, os.WriteFile(p, []byte(strings.Join(lines, "")), 0o644)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
