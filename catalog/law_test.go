package catalog

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Law 2, strategies are content: no Go code in the module compares a value
// with the name of a built-in entry (==, != or a switch case). Built-ins are
// only ever reached through the catalog, like a user's file. Tests and the
// CLI's help texts may mention names; comparisons may not.
func TestNoSwitchOnBuiltinNames(t *testing.T) {
	c, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range c.List() {
		names[e.Name] = true
	}
	// Strategy and topology names that ship as content: named here too, so
	// the test keeps guarding them even if a built-in file is renamed.
	for _, n := range []string{"fedavg", "fedprox", "scaffold", "diloco", "fedbuff", "flat", "tree"} {
		names[n] = true
	}
	root := ".."
	checked := 0
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "vendor" || (strings.HasPrefix(n, ".") && n != "..") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return nil // another engineer's file mid-edit; go vet reports it
		}
		checked++
		isName := func(e ast.Expr) (string, bool) {
			lit, ok := e.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(lit.Value)
			return s, err == nil && names[strings.ToLower(s)]
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					for _, side := range []ast.Expr{n.X, n.Y} {
						if s, ok := isName(side); ok {
							t.Errorf("%s: compares with the built-in name %q; reach built-ins through the catalog", fset.Position(n.Pos()), s)
						}
					}
				}
			case *ast.CaseClause:
				for _, e := range n.List {
					if s, ok := isName(e); ok {
						t.Errorf("%s: switches on the built-in name %q; reach built-ins through the catalog", fset.Position(e.Pos()), s)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked only %d Go files: the walk lost the module", checked)
	}
}
