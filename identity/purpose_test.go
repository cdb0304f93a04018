package identity

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/scellis/scellis/volunteer/proof"
)

// Every signature purpose is declared in sign.go with a distinct value,
// so a signature made for one verifies for no other. Packages that cannot
// import identity repeat a value as a constant named Purpose…: every such
// constant anywhere in the repository must equal one listed in sign.go,
// so a new purpose declared elsewhere (as the volunteer join's once was)
// fails here until it is listed, and a listed one cannot drift.
func TestPurposesDistinct(t *testing.T) {
	if proof.PurposeJoin != string(PurposeVolunteerJoin) {
		t.Fatalf("volunteer/proof's join purpose %q drifted from identity's %q", proof.PurposeJoin, PurposeVolunteerJoin)
	}
	listed := map[string]string{} // value → constant
	for name, v := range purposeConsts(t, "sign.go") {
		if other, dup := listed[v]; dup {
			t.Errorf("%s and %s share the purpose %q", name, other, v)
		}
		listed[v] = name
	}
	if len(listed) < 10 || listed[string(PurposeVolunteerJoin)] != "PurposeVolunteerJoin" {
		t.Fatalf("sign.go's purposes were not found: %v", listed)
	}
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == filepath.Join(root, "identity", "sign.go") {
			return nil
		}
		for name, v := range purposeConsts(t, path) {
			if _, ok := listed[v]; !ok {
				t.Errorf("%s: %s = %q is a signature purpose not declared in identity/sign.go: declare it there", path, name, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// purposeConsts returns the string constants of file whose names start
// with Purpose, by value.
func purposeConsts(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "Purpose") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					out[n.Name] = v
				}
			}
		}
	}
	return out
}
