package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/testfault"
)

// fourSiloCluster is a federation of three aggregators, silos h1–h4 (each
// with a hospital's rows, its config not written: writeHospitalSilos) and
// alice, not started; fault, when set, arms every aggregator with it.
func fourSiloCluster(t *testing.T, fault string) (*cluster, []string) {
	silos := []string{"h1", "h2", "h3", "h4"}
	ms := siloMembers(silos)
	c := newCluster(t, "consortium", 3, append(ms, member{"alice", "researcher"})...)
	if fault != "" {
		c.env = map[string][]string{}
		for _, a := range c.aggs {
			c.env[a] = []string{testfault.Env + "=" + fault}
		}
	}
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "4", "--rows", "200", "--out", "data"))
	return c, silos
}

// writeHospitalSilos writes each silo's config: the i-th hospital's rows,
// a budget of ε = 50, and policy as its policy lines.
func (c *cluster) writeHospitalSilos(silos []string, policy string) {
	for i, s := range silos {
		cfg := hospitalSilo(s, i+1, 50, "silo")
		cfg.policy = policy
		c.writeSilo(cfg)
	}
}

// startAll starts the aggregators, then the silos.
func (c *cluster) startAll(silos []string) {
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
}

// crossCheckCluster is fourSiloCluster, started, with a run spec of
// rounds rounds written as run.yaml; each aggregator serves /metrics at
// the address metrics gives.
func crossCheckCluster(t *testing.T, rounds int, fault string) (c *cluster, metrics map[string]string) {
	c, silos := fourSiloCluster(t, fault)
	pp := &ports{t: t}
	metrics = map[string]string{}
	for _, a := range c.aggs {
		metrics[a] = pp.next()
		b, err := os.ReadFile(filepath.Join(c.dir, a+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		c.write(a+".yaml", string(b)+"metrics_listen: "+metrics[a]+"\n")
	}
	pp.release()
	c.writeHospitalSilos(silos, "  min_cohort: 3\n")
	// standardize: federated adds the statistics step (round 0), whose
	// outcome is the standardisation: both kinds of step are checked.
	c.write("run.yaml", fmt.Sprintf(`name: cross-checked
strategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: %d
privacy: {clip: 5.0, sigma: 0.5, feature_bounds: %s}
standardize: federated
secure_aggregation: true
seed: 5
`, rounds, hospitalRanges))
	c.startAll(silos)
	return c, metrics
}

// launchDone launches spec as alice and waits for the run to be done.
func (c *cluster) launchDone(spec string) string {
	c.t.Helper()
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", spec))
	if out, errs, err := c.cli("alice", "fl", "watch", id); err != nil || !strings.Contains(out, "run done") {
		c.t.Fatalf("the run did not complete (%v):\n%s%s", err, out, errs)
	}
	return id
}

// roundResults are run id's round result documents and the global
// states they carry, as alice reads them.
func (c *cluster) roundResults(t *testing.T, id string) ([]*fl.RoundResult, []fl.Global) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	cl := c.apiClient("alice")
	st, err := cl.Run(ctx, ref(t, id))
	if err != nil {
		t.Fatal(err)
	}
	var docs []*fl.RoundResult
	var gs []fl.Global
	for _, m := range st.Models {
		raw, err := cl.GetBlob(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		doc, g, err := fl.DecodeRoundResult(raw)
		if err != nil {
			t.Fatal(err)
		}
		docs, gs = append(docs, doc), append(gs, g)
	}
	return docs, gs
}

// TestFLReductionCrossChecked: in a cluster of three aggregator
// processes, every round's result document — the statistics step's and
// the training rounds' — cites two aggregator nodes, the leader and a
// peer that replayed the round's secure sum from its transcript and ran
// the step itself, with equal digests, each signed by its node's
// federation key.
func TestFLReductionCrossChecked(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	c, metrics := crossCheckCluster(t, 2, "")
	id := c.launchDone("run.yaml")
	docs, _ := c.roundResults(t, id)
	// fl watch shows it: a line under each step's row, and in --json.
	if out := c.mustCLI("alice", "fl", "watch", id); strings.Count(out, "reduction cross-checked (") != 3 {
		t.Errorf("fl watch does not show each step's cross-check:\n%s", out)
	}
	if out := c.mustCLI("alice", "--json", "fl", "watch", id); strings.Count(out, `"mode":"cross-checked"`) != 3 {
		t.Errorf("fl watch --json does not give each step's check:\n%s", out)
	}
	// The masked inputs reached the checking peer as the leader's host
	// took them (the three steps of four silos each): none, or only
	// those whose forward failed, travelled with the transcripts.
	var forwarded, held float64
	for _, a := range c.aggs {
		m := scrape(t, metrics[a])
		forwarded += m[`scellis_fl_cross_check_inputs_total{how="forwarded"}`]
		held += m[`scellis_fl_cross_check_inputs_total{how="held"}`]
	}
	if forwarded < 1 || forwarded+held != 12 {
		t.Errorf("masked inputs of the cross-checked steps: %v forwarded, %v held; want 12, forwarded as they came", forwarded, held)
	}
	_, fed := c.memberKeys("alice")
	if len(docs) != 3 {
		t.Fatalf("%d round results, want 3 (statistics and two training rounds)", len(docs))
	}
	for r, doc := range docs {
		chk := doc.Check
		if chk == nil || chk.Mode != fl.CrossChecked || len(chk.Nodes) != 2 {
			t.Fatalf("round %d: check %+v, want cross-checked by two nodes", r, chk)
		}
		a, b := chk.Nodes[0], chk.Nodes[1]
		if a.Node == b.Node || a.Digest != b.Digest || a.Digest == "" {
			t.Fatalf("round %d: nodes %s and %s cite digests %s and %s", r, a.Node, b.Node, a.Digest, b.Digest)
		}
		for _, node := range chk.Nodes {
			mem, ok := fed.Member(node.Node)
			st := fl.CheckStatement{Format: fl.CheckStatementFormat, Run: doc.Run, Round: doc.Round, Bundle: doc.Bundle, Node: node.Node, Digest: node.Digest}
			if !ok || mem.Role != identity.Aggregator || node.Key != mem.PublicKey.String() || !identity.VerifyValue(mem.PublicKey, identity.PurposeRoundCheck, st, node.Sig) {
				t.Fatalf("round %d: %s's digest is not signed by an aggregator's federation key", r, node.Node)
			}
		}
		if !slices.Contains(c.aggs, a.Node) || !slices.Contains(c.aggs, b.Node) {
			t.Fatalf("round %d: cited nodes %s, %s", r, a.Node, b.Node)
		}
	}
}

// TestFLCrossCheckDisagreementPauses: every aggregator is armed with
// testfault.SkewCrossCheck, so the peer that recomputes a round for the
// leader gets a sum one ulp off. The first round's digests differ: the
// run is paused at once with SC9107, for a person (it does not resume by
// itself), and no round result is stored as the run's model.
func TestFLCrossCheckDisagreementPauses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	c, _ := crossCheckCluster(t, 1, testfault.SkewCrossCheck)
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	out, errs, err := c.cli("alice", "fl", "watch", id)
	if err == nil || strings.Contains(out, "run done") {
		t.Fatalf("the run completed with a disagreeing cross-check:\n%s%s", out, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	st, err := c.apiClient("alice").Run(ctx, ref(t, id))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != coordinator.RunPaused || st.Heals || !strings.Contains(st.Reason, string(diag.FLCrossCheck)) || len(st.Models) != 0 {
		t.Fatalf("run %s (heals %v), reason %q, %d models; want paused for a person with %s and no model", st.State, st.Heals, st.Reason, len(st.Models), diag.FLCrossCheck)
	}
}
