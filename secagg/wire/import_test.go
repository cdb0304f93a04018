package wire

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDataPlaneImports: the data plane stays apart from the control plane
// (law 3): secagg/wire never imports the coordinator, its API, consensus or
// the appliances, so tensor bytes have no path into them through it.
func TestDataPlaneImports(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	const module = "github.com/scellis/scellis/"
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", module+"secagg/wire").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list returned no dependencies")
	}
	for _, p := range deps {
		for _, banned := range []string{"coordinator", "api", "consensus", "aggregator", "silo", "pool"} {
			if p == module+banned || strings.HasPrefix(p, module+banned+"/") {
				t.Errorf("secagg/wire depends on %s; the data plane must not go through the control plane", p)
			}
		}
	}
}

// TestSecAggFloors: each package of secure aggregation imports from the
// module only what its doc comment allows — the state machines only the
// floor below them (diag, content, identity), the threshold-he machines
// secagg besides, the transport nothing of secagg, and this package the
// machines and the transport: nothing imports upward.
func TestSecAggFloors(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	const module = "github.com/scellis/scellis/"
	floor := []string{"content", "diag", "identity"}
	allowed := map[string][]string{
		"secagg":           floor,
		"secagg/he":        append([]string{"secagg"}, floor...),
		"secagg/transport": floor,
		"secagg/wire":      append([]string{"secagg", "secagg/he", "secagg/transport"}, floor...),
	}
	for pkg, ok := range allowed {
		out, err := exec.Command(goBin, "list", "-f", "{{join .Imports \"\\n\"}}", module+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, imp := range strings.Fields(string(out)) {
			if rel, mine := strings.CutPrefix(imp, module); mine && !slices.Contains(ok, rel) {
				t.Errorf("%s imports %s; it may import only %v of the module", pkg, rel, ok)
			}
		}
	}
}
