// Package roundpath holds checks over the packages a training round's
// release goes through (fl, silo, secagg, secagg/wire, aggregator).
package roundpath

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// roundPackages are the directories whose code runs between a client
// step's update and the secure sum.
var roundPackages = []string{"fl", "silo", "secagg", "secagg/wire", "aggregator"}

// floatNoise are the calls that draw floating-point Gaussian (or other
// continuous) noise: none may appear on the round path, where every
// release is noised on the integer grid with the exact discrete Gaussian
// (dp.GridGaussian). DP-SGD's float noise stays inside model's trainers.
var floatNoise = map[string]bool{
	"NormFloat64": true, "ExpFloat64": true, "AddGaussian": true,
	"NoisyClippedSum": true, "PrivatizeUpdate": true,
}

// allowed lists the exceptions, each with its reason: file → function.
var allowed = map[string]string{
	// simulated compute speeds of sites in a local simulation (stragglers),
	// from the simulation's seeded generator: not privacy noise, never sent.
	"fl/simulate.go": "runAsync",
}

// No float noise is reachable from the round path: every call in the
// non-test Go files of the round-path packages is checked by name.
func TestNoFloatNoiseOnRoundPath(t *testing.T) {
	root := filepath.Join("..", "..")
	found := 0
	for _, dir := range roundPackages {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			fs := token.NewFileSet()
			f, err := parser.ParseFile(fs, path, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			found++
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				ast.Inspect(decl, func(n ast.Node) bool {
					call, ok2 := n.(*ast.CallExpr)
					if !ok2 {
						return true
					}
					var name string
					switch c := call.Fun.(type) {
					case *ast.SelectorExpr:
						name = c.Sel.Name
					case *ast.Ident:
						name = c.Name
					}
					if !floatNoise[name] {
						return true
					}
					if ok && allowed[filepath.ToSlash(rel)] == fn.Name.Name {
						return true
					}
					t.Errorf("%s: %s calls %s: float noise on the round path (use dp.GridGaussian / dp.ReleaseOnGrid)", fs.Position(call.Pos()), funcName(fn, ok), name)
					return true
				})
			}
		}
	}
	if found < 20 {
		t.Fatalf("only %d files scanned: the package list is stale", found)
	}
}

func funcName(fn *ast.FuncDecl, ok bool) string {
	if !ok {
		return "a declaration"
	}
	return fn.Name.Name
}
