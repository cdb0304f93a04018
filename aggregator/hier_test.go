package aggregator

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// A parent's plan of hierarchical rounds (hier.go), in process: the
// cohort split by the child leading each silo, the refusals (a child
// leading too few of the cohort, SC9301; a cohort mixing silos led here
// and by children, a threshold-he round, SC7604), and the sub-cohorts'
// Params: the parent's fresh key in each, one grid, which secagg's parent
// accepts. The federation file refuses a cluster: on a non-silo or
// naming no member of role cluster (SC1005).
func TestHierarchicalRoundPlan(t *testing.T) {
	keys := map[string]*identity.Identity{}
	var fed strings.Builder
	fed.WriteString("federation: pool\nregime: own\nmembers:\n")
	member := func(name, role, extra string) {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = id
		fmt.Fprintf(&fed, "  - name: %s\n    role: %s\n    public_key: %s\n%s", name, role, id.Public(), extra)
	}
	member("agg-1", "aggregator", "    address: 127.0.0.1:7400\n")
	member("eu", "cluster", "")
	member("us", "cluster", "")
	for _, s := range []string{"e1", "e2", "e3"} {
		member(s, "silo", "    cluster: eu\n")
	}
	for _, s := range []string{"u1", "u2", "u3", "u4"} {
		member(s, "silo", "    cluster: us\n")
	}
	member("own", "silo", "")
	f, err := identity.ParseFederation("federation.yaml", []byte(fed.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"  - {name: w, role: worker, public_key: %s, cluster: eu}\n", "  - {name: w, role: silo, public_key: %s, cluster: agg-1}\n"} {
		id, _ := identity.Generate()
		_, err := identity.ParseFederation("federation.yaml", []byte(fed.String()+fmt.Sprintf(bad, id.Public())))
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.InvalidValue {
			t.Errorf("federation with %q: %v, want SC1005", bad, err)
		}
	}
	n := &Node{fed: f}

	code := func(err error) diag.Code {
		if ds, ok := diag.As(err); ok {
			return ds[0].Code
		}
		return ""
	}
	if byChild, err := n.hierCohort("run r", []string{"own", "e1"}, 0); err == nil || code(err) != diag.TreeRound || byChild != nil {
		t.Errorf("a cohort mixing own and children's silos: %v, want SC7604", err)
	}
	if _, err := n.hierCohort("run r", []string{"e1", "e2", "u1", "u2", "u3"}, 0); code(err) != diag.RunTooFewSites || !strings.Contains(err.Error(), "eu leads 2") {
		t.Errorf("a sub-cohort of two: %v, want SC9301 naming eu", err)
	}
	if _, err := n.hierCohort("run r", []string{"e1", "e2", "e3", "u1", "u2", "u3", "u4"}, 4); code(err) != diag.RunTooFewSites {
		t.Errorf("a sub-cohort below cohort.min: %v, want SC9301", err)
	}
	if byChild, err := n.hierCohort("run r", []string{"own"}, 0); err != nil || byChild != nil {
		t.Errorf("a cohort led here: %v %v, want a flat round", byChild, err)
	}
	all := []string{"e1", "e2", "e3", "u1", "u2", "u3", "u4"}
	byChild, err := n.hierCohort("run r", all, 0)
	if err != nil || len(byChild["eu"]) != 3 || len(byChild["us"]) != 4 {
		t.Fatalf("split %v: %v", byChild, err)
	}
	var members []secagg.Member
	for _, s := range all {
		members = append(members, secagg.Member{ID: s, Key: keys[s].Public().Ed25519()})
	}
	b := fl.RoundBundle{SecAgg: secagg.Params{Round: "parent-round", Members: members, Dim: 5, Clip: roundClip, Weighted: true, MaxWeight: roundMaxWeight}}
	flat, err := b.SecAgg.FracBits()
	if err != nil {
		t.Fatal(err)
	}
	key, err := splitRound(&b, byChild, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.SecAgg.GridBits != flat || len(b.SubCohorts) != 2 || b.SubCohorts[0].Cluster != "eu" || b.SubCohorts[1].Cluster != "us" {
		t.Fatalf("split round: grid %d (flat %d), sub-cohorts %+v", b.SecAgg.GridBits, flat, b.SubCohorts)
	}
	var cohorts []secagg.Params
	for _, sc := range b.SubCohorts {
		p := sc.SecAgg
		if !bytes.Equal(p.Parent, key.PublicKey().Bytes()) || p.GridBits != flat || p.Sites != len(all) || p.Round == b.SecAgg.Round || len(p.Members) != len(byChild[sc.Cluster]) {
			t.Errorf("sub-cohort %s: %+v", sc.Cluster, p)
		}
		cohorts = append(cohorts, p)
	}
	if b.SubCohorts[0].SecAgg.Round == b.SubCohorts[1].SecAgg.Round {
		t.Error("two sub-cohorts share a round ID")
	}
	if _, err := secagg.NewParent(b.SecAgg.Round, key, cohorts); err != nil {
		t.Fatalf("the parent refuses the plan's sub-cohorts: %v", err)
	}
	// A site reads its own sub-cohort's Params, and no host.
	b.Reducer = "agg-1"
	if s, ok := b.ForSite("u2"); !ok || s.SecAgg.Round != b.SubCohorts[1].SecAgg.Round || s.Reducer != "" {
		t.Errorf("ForSite(u2): %v %+v", ok, s.SecAgg)
	}
	if _, ok := b.ForSite("own"); ok {
		t.Error("ForSite of a silo in no sub-cohort")
	}
	// A second round draws another key.
	b2 := fl.RoundBundle{SecAgg: b.SecAgg, HE: nil}
	b2.SubCohorts = nil
	key2, err := splitRound(&b2, byChild, 0)
	if err != nil || key2.Equal(key) {
		t.Errorf("a second round's key: %v (same key: %v)", err, key2 != nil && key2.Equal(key))
	}
	b2.SubCohorts, b2.HE = nil, &fl.HERound{}
	if _, err := splitRound(&b2, byChild, 0); code(err) != diag.TreeRound {
		t.Errorf("a threshold-he round over a tree: %v, want SC7604", err)
	}
}
