package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/scellis/scellis/identity"
)

// writeRegionFederation writes a federation of 9 aggregators and 9 silos
// over two regions (eu: agg-1..3 and 5 silos; us: agg-4..6 and 4 silos;
// agg-7..9 without a region) and returns its path.
func writeRegionFederation(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("federation: topo\nregime: consortium\nmembers:\n")
	member := func(name, role, region, extra string) {
		id := identity.NewFromSeed(sha256.Sum256([]byte(name))) // a fixed key per name: the test signs nothing
		fmt.Fprintf(&b, "  - name: %s\n    role: %s\n    public_key: %s\n", name, role, id.Public())
		if region != "" {
			fmt.Fprintf(&b, "    region: %s\n", region)
		}
		b.WriteString(extra)
	}
	for i := 1; i <= 9; i++ {
		region := map[bool]string{true: "eu", false: "us"}[i <= 3]
		if i > 6 {
			region = ""
		}
		member(fmt.Sprintf("agg-%d", i), "aggregator", region, fmt.Sprintf("    address: 127.0.0.1:%d\n", 17400+i))
	}
	for i := 1; i <= 9; i++ {
		region := map[bool]string{true: "eu", false: "us"}[i <= 5]
		member(fmt.Sprintf("site-%d", i), "silo", region, fmt.Sprintf("    capacity: %d\n", i))
	}
	path := filepath.Join(dir, "federation.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A user sees what a topology does with their federation before running
// anything: the built-ins and their own file through the real binary, and
// a broken file refused with a diagnostic at its line (exit code 2).
func TestTopologyPlanCLI(t *testing.T) {
	t.Parallel() // no servers: its own directory only
	dir := t.TempDir()
	fed := writeRegionFederation(t, dir)

	out := mustRun(t, scellisCmd(t, dir, "topology", "plan", "--federation", fed))
	if !strings.Contains(out, "topology flat") || !strings.Contains(out, "1 cluster, depth 0") || !strings.Contains(out, "9 members, 9 silos") {
		t.Fatalf("flat plan:\n%s", out)
	}

	out = mustRun(t, scellisCmd(t, dir, "topology", "plan", "--federation", fed, "--topology", "tree", "--param", "by=region", "--json"))
	var plan struct {
		Topology string
		Clusters []struct {
			Name, Parent string
			Nodes        []string
			SubCohort    []string `json:"sub_cohort"`
		}
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if plan.Topology != "tree" || len(plan.Clusters) != 3 || plan.Clusters[0].Name != "root" {
		t.Fatalf("tree by region: %s", out)
	}
	for _, c := range plan.Clusters[1:] {
		if c.Parent != "root" || len(c.Nodes) != 3 || (c.Name == "eu-0") != (len(c.SubCohort) == 5) || !strings.HasPrefix(c.Nodes[0], map[bool]string{true: "agg-1", false: "agg-4"}[c.Name == "eu-0"]) {
			t.Fatalf("cluster %+v in %s", c, out)
		}
	}

	// A user's file, grouping by capacity: the big sites under one child,
	// the small under another.
	user := filepath.Join(dir, "by-capacity.star")
	src := `"""by-capacity: sites of capacity 5 and more under one cluster, the rest under another."""

def topology(members, params):
    aggs = [m["name"] for m in members if m["role"] == "aggregator"]
    big = [m["name"] for m in members if m["role"] == "silo" and m["capacity"] >= params.get("threshold", 5)]
    small = [m["name"] for m in members if m["role"] == "silo" and m["capacity"] < params.get("threshold", 5)]
    return {
        "fanout": 8,
        "clusters": [
            {"name": "root", "parent": None, "nodes": aggs[6:]},
            {"name": "big", "parent": "root", "nodes": aggs[0:3], "leads": big},
            {"name": "small", "parent": "root", "nodes": aggs[3:6], "leads": small},
        ],
    }
`
	if err := os.WriteFile(user, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out = mustRun(t, scellisCmd(t, dir, "topology", "plan", "--federation", fed, "--topology", "./by-capacity.star"))
	for _, want := range []string{"topology by-capacity", "3 clusters, depth 1; fan-out limit 8", "cluster big", "5 members, 5 silos: site-5, site-6", "sums      its sub-cohort of 4 silos → root"} {
		if !strings.Contains(out, want) {
			t.Fatalf("user plan lacks %q:\n%s", want, out)
		}
	}

	// threshold=3 leaves two silos under "small": below the three-site
	// minimum, refused at the topology's def line with exit code 2.
	code, _, stderr := runBounded(t, scellisBinary(t), dir, "topology", "plan", "--federation", fed, "--topology", "./by-capacity.star", "--param", "threshold=3")
	if code != 2 || !strings.Contains(stderr, "SC9301") || !strings.Contains(stderr, "by-capacity.star:3:") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	// A bad region in the federation file is refused at its line.
	bad := filepath.Join(dir, "bad.yaml")
	raw, _ := os.ReadFile(fed)
	if err := os.WriteFile(bad, bytes.Replace(raw, []byte("region: us\n"), []byte("region: US East\n"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBounded(t, scellisBinary(t), dir, "topology", "plan", "--federation", bad)
	if code != 2 || !strings.Contains(stderr, "SC1005") || !strings.Contains(stderr, "bad.yaml:") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	// A program is not a topology.
	code, _, stderr = runBounded(t, scellisBinary(t), dir, "topology", "plan", "--federation", fed, "--topology", "sum")
	if code != 2 || !strings.Contains(stderr, "SC2012") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}

	for _, args := range [][]string{{"--members", "0"}, {"--fanout", "2"}, {"--fanout", "1000000000000"}, {"--param", "fanout"}} {
		code, _, stderr = runBounded(t, scellisBinary(t), dir, append([]string{"topology", "simulate"}, args...)...)
		if code != 2 || !strings.Contains(stderr, "SC1005") {
			t.Fatalf("simulate %v: exit %d, stderr:\n%s", args, code, stderr)
		}
	}
	out = mustRun(t, scellisCmd(t, dir, "topology", "simulate", "--members", "1000", "--fanout", "32"))
	if !strings.Contains(out, "tree fanout=32") || !strings.Contains(out, "13000") {
		t.Fatalf("simulate:\n%s", out)
	}
}

// --param values are typed as YAML types a plain scalar: nan and inf are
// strings (as floats they reached content and broke --json), a number
// beyond float64 too.
func TestParseParams(t *testing.T) {
	got, err := parseParams([]string{"a=3", "b=2.5", "c=true", "d=nan", "e=-Inf", "f=1e400", "g=x=y", "h="})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"a": int64(3), "b": 2.5, "c": true, "d": "nan", "e": "-Inf", "f": "1e400", "g": "x=y", "h": ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
	for _, bad := range [][]string{{"=1"}, {"k"}, {"k=1", "k=2"}} {
		if _, err := parseParams(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
