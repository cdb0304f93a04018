package topology

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// federation returns a aggregators, s silos and w workers; regions, if
// given, are dealt round-robin to silos and workers.
func federation(a, s, w int, regions ...string) []Member {
	var out []Member
	for i := range a {
		out = append(out, Member{Name: fmt.Sprintf("agg-%d", i), Role: identity.Aggregator})
	}
	for i := range s + w {
		m := Member{Name: fmt.Sprintf("silo-%03d", i), Role: identity.Silo}
		if i >= s {
			m = Member{Name: fmt.Sprintf("worker-%03d", i-s), Role: identity.Worker}
		}
		if len(regions) > 0 {
			m.Region = regions[i%len(regions)]
		}
		out = append(out, m)
	}
	return out
}

func evaluate(t *testing.T, ref string, members []Member, params map[string]any) (*Plan, error) {
	t.Helper()
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	e, err := Resolve(c, ref, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return Evaluate(context.Background(), c, e, members, params)
}

func wantCode(t *testing.T, err error, code diag.Code, text string) {
	t.Helper()
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("want %s, got %v", code, err)
	}
	for _, d := range ds {
		if d.Code == code && strings.Contains(d.Error(), text) {
			return
		}
	}
	t.Fatalf("want %s mentioning %q, got %v", code, text, err)
}

// checkPlaced is the invariant every Plan keeps, recomputed naively.
func checkPlaced(t *testing.T, p *Plan, members []Member) {
	t.Helper()
	count := map[string]int{}
	for _, c := range p.Clusters {
		for _, m := range append(append([]string(nil), c.Nodes...), c.Leads...) {
			count[m]++
		}
		if p.FanOut > 0 && c.FanOut() > p.FanOut {
			t.Errorf("cluster %s fan-out %d > %d", c.Name, c.FanOut(), p.FanOut)
		}
	}
	for _, m := range members {
		if count[m.Name] != 1 {
			t.Errorf("member %s placed %d times", m.Name, count[m.Name])
		}
		if c, ok := p.ClusterOf(m.Name); !ok || c == nil {
			t.Errorf("ClusterOf(%s) = %v", m.Name, ok)
		}
	}
}

func TestFlat(t *testing.T) {
	members := federation(3, 4, 2)
	p, err := evaluate(t, "flat", members, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
	r := p.Root()
	if len(p.Clusters) != 1 || r.Name != "root" || len(r.Nodes) != 3 || len(r.Leads) != 6 || len(r.SubCohort) != 4 || p.Depth() != 0 || p.FanOut != 0 {
		t.Fatalf("flat plan %+v", p)
	}
	if _, err := evaluate(t, "flat", members, map[string]any{"fanout": int64(3)}); err == nil {
		t.Fatal("flat took a param")
	}
}

func TestTreeBySize(t *testing.T) {
	// 9 aggregators, 9 silos, fan-out 5: two leaves of 5 and 4 silos under
	// a root, three aggregators each — the tree the multi-process test runs.
	members := federation(9, 9, 0)
	p, err := evaluate(t, "tree", members, map[string]any{"fanout": int64(5)})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
	if len(p.Clusters) != 3 || p.Depth() != 1 || p.Root().Name != "root" || len(p.Root().Children) != 2 {
		t.Fatalf("tree %+v", p.Clusters)
	}
	for _, c := range p.Clusters {
		if len(c.Nodes) != 3 {
			t.Errorf("cluster %s has %d nodes", c.Name, len(c.Nodes))
		}
	}
	if got := len(p.SubCohort("leaf-0")) + len(p.SubCohort("leaf-1")); got != 9 {
		t.Fatalf("sub-cohorts hold %d silos", got)
	}

	// Three levels: 1,000 silos and workers with fan-out 10 need 100
	// leaves, 10 clusters above them and a root.
	members = federation(111, 700, 300)
	p, err = evaluate(t, "tree", members, map[string]any{"fanout": int64(10)})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
	if len(p.Clusters) != 111 || p.Depth() != 2 || p.MaxFanOut() > 10 {
		t.Fatalf("%d clusters, depth %d, max fan-out %d", len(p.Clusters), p.Depth(), p.MaxFanOut())
	}

	// Everything fits in one cluster: the tree is flat.
	members = federation(3, 5, 0)
	p, err = evaluate(t, "tree", members, nil)
	if err != nil || len(p.Clusters) != 1 {
		t.Fatalf("%v %+v", err, p)
	}

	// Too few aggregators for the clusters the tree needs.
	_, err = evaluate(t, "tree", federation(2, 9, 0), map[string]any{"fanout": int64(5)})
	wantCode(t, err, diag.StarlarkRuntime, "3 clusters need at least 3 aggregators")
}

func TestTreeByRegion(t *testing.T) {
	members := federation(9, 9, 3, "eu", "us")
	members[0].Region, members[1].Region = "us", "us" // agg-0, agg-1 in us
	p, err := evaluate(t, "tree", members, map[string]any{"by": "region"})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
	eu, ok := p.Cluster("eu-0")
	us, ok2 := p.Cluster("us-0")
	if !ok || !ok2 || len(p.Clusters) != 3 || eu.Parent != "root" {
		t.Fatalf("region tree %+v", p.Clusters)
	}
	if len(eu.SubCohort) != 5 || len(us.SubCohort) != 4 || us.Nodes[0] != "agg-0" || us.Nodes[1] != "agg-1" {
		t.Fatalf("eu %+v us %+v", eu, us)
	}
	members[11].Region = "" // a silo
	_, err = evaluate(t, "tree", members, map[string]any{"by": "region"})
	wantCode(t, err, diag.StarlarkRuntime, "has no region")
	_, err = evaluate(t, "tree", members, map[string]any{"by": "colour"})
	wantCode(t, err, diag.StarlarkRuntime, "params.by")
	// A fan-out past what a plan may declare is refused by tree itself,
	// not by a slice index deep inside it.
	_, err = evaluate(t, "tree", members, map[string]any{"fanout": int64(1) << 40})
	wantCode(t, err, diag.StarlarkRuntime, "params.fanout must be an int from 3 to 2^30")

	// A region with two silos is a sub-cohort below the minimum.
	members = federation(6, 5, 0, "eu", "eu", "eu", "us", "us")
	_, err = evaluate(t, "tree", members, map[string]any{"by": "region"})
	wantCode(t, err, diag.RunTooFewSites, `cluster "us-0" leads 2 silo(s)`)
}

// A user's file goes through the same path, and every way a plan can be
// wrong is a diagnostic at the topology function, all reported at once.
func TestUserTopologyRefusals(t *testing.T) {
	members := federation(3, 6, 0)
	for name, tc := range map[string]struct {
		body string
		code diag.Code
		text string
	}{
		"not a dict":   {`return []`, diag.ContentShape, "a list, not a dict"},
		"unknown key":  {`return {"clusters": [], "fanuot": 3}`, diag.ContentShape, `"fanuot"`},
		"placed twice": {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2"], "leads": [m["name"] for m in members if m["role"] == "silo"] + ["silo-000"]}]}`, diag.TopologyInvalid, "silo-000 (in r and r)"},
		"not placed":   {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1"], "leads": ["silo-000"]}]}`, diag.TopologyInvalid, "6 member(s) not placed"},
		"stranger":     {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2", "mallory"], "leads": [m["name"] for m in members if m["role"] == "silo"]}]}`, diag.TopologyInvalid, "mallory"},
		"two roots":    {`return {"clusters": [{"name": "a", "parent": None, "nodes": ["agg-0"]}, {"name": "b", "parent": None, "nodes": ["agg-1", "agg-2"], "leads": [m["name"] for m in members if m["role"] == "silo"]}]}`, diag.TopologyInvalid, "2 clusters have no parent"},
		"cycle":        {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0"], "leads": [m["name"] for m in members if m["role"] == "silo"]}, {"name": "a", "parent": "b", "nodes": ["agg-1"]}, {"name": "b", "parent": "a", "nodes": ["agg-2"]}]}`, diag.TopologyInvalid, "cycle"},
		"no nodes":     {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2"]}, {"name": "c", "parent": "r", "nodes": [], "leads": [m["name"] for m in members if m["role"] == "silo"]}]}`, diag.TopologyInvalid, `"c" has no nodes`},
		"fan-out":      {`return {"fanout": 4, "clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2"], "leads": [m["name"] for m in members if m["role"] == "silo"]}]}`, diag.TopologyInvalid, "over the fan-out limit 4"},
		"silo as node": {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2", "silo-000"], "leads": [m["name"] for m in members if m["role"] == "silo" and m["name"] != "silo-000"]}]}`, diag.TopologyInvalid, "not an aggregator"},
		"small cohort": {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0"], "leads": ["silo-000", "silo-001", "silo-002", "silo-003"]}, {"name": "c", "parent": "r", "nodes": ["agg-1", "agg-2"], "leads": ["silo-004", "silo-005"]}]}`, diag.RunTooFewSites, `"c" leads 2 silo(s)`},
		// A name content makes up is quoted: raw, its escape sequences
		// and newline would forge lines of the report.
		"hostile name":   {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1", "agg-2"], "leads": [m["name"] for m in members if m["role"] == "silo"] + ["\x1b[31m\nerror[SC0000]: fake"]}]}`, diag.TopologyInvalid, `"\x1b[31m\nerror[SC0000]: fake" (in r)`},
		"parent \"\"":    {`return {"clusters": [{"name": "r", "parent": "", "nodes": ["agg-0"]}]}`, diag.ContentShape, `parent "":`},
		"unknown parent": {`return {"clusters": [{"name": "r", "parent": None, "nodes": ["agg-0", "agg-1"]}, {"name": "c", "parent": "x", "nodes": ["agg-2"], "leads": [m["name"] for m in members if m["role"] == "silo"]}]}`, diag.TopologyInvalid, `parent "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "mine.star")
			src := "\"\"\"mine: a user's topology.\"\"\"\n\ndef topology(members, params):\n    " + tc.body + "\n"
			if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := evaluate(t, path, members, nil)
			wantCode(t, err, tc.code, tc.text)
			d, _ := diag.As(err)
			if d[0].Pos == nil || d[0].Pos.File != path || d[0].Pos.Line != 3 {
				t.Fatalf("position %v, want %s:3", d[0].Pos, path)
			}
		})
	}
	// A program is not a topology.
	c, _ := catalog.Builtin()
	if _, err := Resolve(c, "sum", ""); err == nil {
		t.Fatal("a reducer resolved as a topology")
	} else {
		wantCode(t, err, diag.ContentKind, "not a topology")
	}
}

// A child cluster listed in the federation as a member (role cluster, the
// tree of clusters' delegate) is led like a worker: placed once, counted
// in the fan-out, never in a sub-cohort.
func TestClusterMembersAreLed(t *testing.T) {
	members := append(federation(3, 3, 0), Member{Name: "child-a", Role: identity.Cluster}, Member{Name: "child-b", Role: identity.Cluster})
	p, err := evaluate(t, "flat", members, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
	if r := p.Root(); len(r.Leads) != 5 || len(r.SubCohort) != 3 {
		t.Fatalf("root %+v", r)
	}
	p, err = evaluate(t, "tree", members, map[string]any{"fanout": int64(4)})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, members)
}

// A chain of clusters as deep as its aggregators are many is a valid
// plan; its text grows with the number of clusters, not the square of
// the depth (indentation stops at maxIndent levels).
func TestWriteTextDeepChain(t *testing.T) {
	const n = 400
	path := filepath.Join(t.TempDir(), "chain.star")
	src := `def topology(members, params):
    aggs = [m["name"] for m in members if m["role"] == "aggregator"]
    cl = [{"name": "c0", "parent": None, "nodes": [aggs[0]], "leads": [m["name"] for m in members if m["role"] == "silo"]}]
    for i in range(1, len(aggs)):
        cl.append({"name": "c%d" % i, "parent": "c%d" % (i - 1), "nodes": [aggs[i]]})
    return {"clusters": cl}
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := evaluate(t, path, federation(n, 3, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := p.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if p.Depth() != n-1 || !strings.Contains(b.String(), fmt.Sprintf("cluster c%d (depth %d)", n-1, n-1)) || b.Len() > 300*n {
		t.Fatalf("depth %d, %d bytes of text; tail:\n%s", p.Depth(), b.Len(), b.String()[max(0, b.Len()-300):])
	}
}

// A topology over its budget is told what it can do: no job limit
// applies to it.
func TestTopologyBudgetHelp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "greedy.star")
	if err := os.WriteFile(path, []byte("def topology(members, params):\n    return [0] * (1 << 40)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := evaluate(t, path, federation(3, 3, 0), nil)
	wantCode(t, err, diag.MemoryBudget, "nothing raises")
	wantCode(t, err, diag.MemoryBudget, "6 here")
}
