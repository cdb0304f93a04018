package coordinator

import (
	"os/exec"
	"strings"
	"testing"
)

// The ★ import rule of ARCHITECTURE.md: the coordinator never imports
// tensor, model or script (nor anything under them), and within this
// module it depends only on the packages below it that it needs.
func TestImportRule(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	const module = "github.com/scellis/scellis/"
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", module+"coordinator").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// internal/safefile is a standard-library-only leaf that diag uses to
	// quote a config line without hanging on a FIFO; it touches no tensor.
	// verify/spot holds the verification regime's pure decisions (quorum, spot
	// checks, reputation, canaries) that the machine applies; it stays
	// free of tensor, so work on tensors (Freivalds' products, tolerance
	// comparisons of decoded results) lives where peers run it, in a
	// package the coordinator does not import.
	allowed := map[string]bool{"content": true, "diag": true, "trust": true, "receipt": true, "coordinator": true, "internal/safefile": true, "verify/spot": true}
	var deps int
	for _, p := range strings.Fields(string(out)) {
		deps++
		for _, banned := range []string{"tensor", "model", "script"} {
			if p == module+banned || strings.HasPrefix(p, module+banned+"/") {
				t.Errorf("coordinator depends on %s (law 3: the coordinator never touches tensor bytes)", p)
			}
		}
		if rest, ok := strings.CutPrefix(p, module); ok && !allowed[rest] {
			t.Errorf("coordinator depends on %s; it may use only content, diag, trust, receipt, verify/spot and internal/safefile", p)
		}
	}
	if deps == 0 {
		t.Fatal("go list returned no dependencies")
	}
}
