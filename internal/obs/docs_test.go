package obs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every scellis_* series the code defines (a prometheus.NewDesc name or an
// Opts Name) is documented in docs/operations.md, and every series the doc
// tabulates is defined: a renamed series cannot leave dashboards and alerts
// written from the doc silently empty. It reads the sources, so it costs no
// process and no listener.
func TestMetricNamesDocumented(t *testing.T) {
	root := filepath.Join("..", "..")
	defined := regexp.MustCompile(`(?:NewDesc\(\s*|Name:\s*)"(scellis_[a-z0-9_]+)"`)
	code := map[string]string{} // series → file defining it
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range defined.FindAllStringSubmatch(string(b), -1) {
			code[m[1]] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(code) < 20 {
		t.Fatalf("found only %d series in the sources: the pattern no longer matches how they are defined", len(code))
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	// A documented series: `scellis_name` or `scellis_name{labels}` in a table row.
	documented := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `scellis_") {
			continue
		}
		for _, m := range regexp.MustCompile("`(scellis_[a-z0-9_]+)[`{]").FindAllStringSubmatch(strings.Split(line, "|")[1], -1) {
			documented[m[1]] = true
		}
	}
	for s, file := range code {
		if !documented[s] {
			t.Errorf("series %s (defined in %s) is not in docs/operations.md's tables", s, file)
		}
	}
	for s := range documented {
		if _, ok := code[s]; !ok {
			t.Errorf("docs/operations.md documents %s, which no code defines", s)
		}
	}
}
