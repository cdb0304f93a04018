package wire

import (
	"os/exec"
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
