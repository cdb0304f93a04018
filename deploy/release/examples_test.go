package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/deploy/internal/testbin"
)

// The config examples the .deb ships (deploy/examples) pass `scellis
// config check`, which rejects unknown keys and runs every start-up check,
// placed in a real federation made by `scellis federation init
// --state-dir /var/lib/scellis` — with /var/lib/scellis and /srv/scellis
// moved under the test's folder — so an example that drifts from the
// config format fails here.
func TestExamplesPassConfigCheck(t *testing.T) {
	dir := t.TempDir()
	fed := filepath.Join(dir, "fed")
	state, srv := filepath.Join(dir, "var-lib-scellis"), filepath.Join(dir, "srv-scellis")
	runBin(t, testBin, "federation", "init", "--dir", fed, "--aggregators", "1", "--silos", "1", "--workers", "1", "--state-dir", "/var/lib/scellis")
	if err := testbin.PatientsCSV(testBin, filepath.Join(srv, "silo-1")); err != nil {
		t.Fatal(err)
	}
	moved := strings.NewReplacer("/var/lib/scellis", state, "/srv/scellis", srv)
	for role, member := range map[string]string{"aggregator": "agg-1", "silo": "silo-1", "worker": "worker-1"} {
		example := read(t, testOpts.root, "deploy", "examples", role+".yaml")
		if !strings.Contains(string(example), "\nname: "+member+"\n") {
			t.Fatalf("examples/%s.yaml is not %s's config", role, member)
		}
		cfg := filepath.Join(fed, member, role+".yaml")
		if err := os.WriteFile(cfg, []byte(moved.Replace(string(example))), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(testBin, "config", "check", cfg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "is valid") {
			t.Errorf("scellis config check of examples/%s.yaml: %v\n%s", role, err, out)
		}
	}
}
