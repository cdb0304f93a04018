package archmap

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/scellis/scellis/"

var root = filepath.Join("..", "..")

// tree is the module's packages (directories holding Go files, by their
// path below the module), what each imports of the module outside its
// tests, and the names of its test functions.
type tree struct {
	imports map[string]map[string]bool
	tests   map[string]bool
}

func readTree(t *testing.T) tree {
	t.Helper()
	tr := tree{imports: map[string]map[string]bool{}, tests: map[string]bool{}}
	testFunc := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module (deploy/)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		if tr.imports[pkg] == nil {
			tr.imports[pkg] = map[string]bool{}
		}
		if strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
				tr.tests[m[1]] = true
			}
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if dep, ok := strings.CutPrefix(p, module); ok {
				tr.imports[pkg][dep] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.imports) < 10 || len(tr.tests) < 10 {
		t.Fatalf("read %d packages and %d tests below %s: not the module", len(tr.imports), len(tr.tests), root)
	}
	return tr
}

// readMap returns docs/architecture.md without its fenced blocks (the
// diagram), whose fences would pair with code spans.
func readMap(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	return fenced.ReplaceAllString(string(b), "")
}

var fenced = regexp.MustCompile("(?ms)^```.*?^```$")

var ticked = regexp.MustCompile("`([^`]+)`")

// floors reads the page's floor table: package → floor number.
func floors(t *testing.T, doc string) map[string]int {
	t.Helper()
	row := regexp.MustCompile(`(?m)^\| L(\d) \| ([^|]+) \|`)
	out := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		n, _ := strconv.Atoi(m[1])
		for _, p := range ticked.FindAllStringSubmatch(m[2], -1) {
			if f, dup := out[p[1]]; dup {
				t.Errorf("package %s stands on floors L%d and L%d", p[1], f, n)
			}
			out[p[1]] = n
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/architecture.md has no floor table (rows | Ln | `pkg`, … |)")
	}
	return out
}

// Every package of the module stands on one floor of the map, every
// package the map places exists, and nothing imports upward.
func TestFloors(t *testing.T) {
	tr := readTree(t)
	floor := floors(t, readMap(t))
	for p := range floor {
		if _, ok := tr.imports[p]; !ok {
			t.Errorf("docs/architecture.md places package %s, which does not exist", p)
		}
	}
	for p, deps := range tr.imports {
		f, ok := floor[p]
		if !ok {
			t.Errorf("package %s stands on no floor of docs/architecture.md", p)
			continue
		}
		for d := range deps {
			if g, ok := floor[d]; ok && g > f {
				t.Errorf("%s (L%d) imports %s (L%d): a lower floor never imports a higher one", p, f, d, g)
			}
		}
	}
}

// Every package, file and test the map names in code spans exists.
func TestMapNamesExist(t *testing.T) {
	tr := readTree(t)
	doc := readMap(t)
	test := regexp.MustCompile(`^(?:Test|Fuzz|Benchmark)[A-Z0-9]\w*$`)
	file := regexp.MustCompile(`^[a-z][\w./-]*\.(?:go|txt|md|star)$`)
	pkg := regexp.MustCompile(`^[a-z][a-z0-9_-]*(?:/[a-z][a-z0-9_-]*)*$`)
	var names int
	for _, m := range ticked.FindAllStringSubmatch(doc, -1) {
		s := m[1]
		switch {
		case test.MatchString(s):
			if !tr.tests[s] {
				t.Errorf("docs/architecture.md names test %s, which no _test.go file defines", s)
			}
		case file.MatchString(s) && strings.Contains(s, "/"):
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(s))); err != nil {
				t.Errorf("docs/architecture.md names file %s: %v", s, err)
			}
		case pkg.MatchString(s):
			if _, ok := tr.imports[s]; !ok {
				t.Errorf("docs/architecture.md names package %s, which does not exist", s)
			}
		default:
			continue
		}
		names++
	}
	if names < 20 {
		t.Fatalf("docs/architecture.md names only %d packages, files and tests", names)
	}
}
