package aggregator

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/studio"
	"github.com/scellis/scellis/trust"
)

// A node with studio_listen serves the Studio: a member's client
// certificate admits it, and a finished sweep's heatmap holds every cell
// with the best one marked, laid out from the plan a child compiled.
func TestStudioServesSweepHeatmap(t *testing.T) {
	t.Parallel()
	addr := freeAddrs(t, 1)[0]
	p := newTestPool(t, trust.Own, 2, Options{LeaseTTL: 2 * time.Second, StudioListen: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plan := p.mustCompile(ctx, map[string]string{
		"score.star": "def run(params, inputs):\n    return {\"score\": 1.0 * params[\"a\"] - params[\"b\"]}\n",
		"job.yaml":   "name: heat\nprogram: ./score.star\npartitioner: {use: grid, params: {a: [1, 2, 3], b: [1, 2]}}\nreducer: {use: collect, params: {metric: score, goal: max}}\n",
	})
	p.startWorkers(2, 20*time.Millisecond)
	p.mustSubmit(ctx, plan)
	if _, err := p.waitDone(ctx, plan.ID); err != nil {
		t.Fatal(err)
	}
	cfg, err := identity.ClientTLSConfig(p.ids["alice"], p.fed, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
	res, err := hc.Get("https://" + addr + "/api/picture")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var pic studio.Picture
	if err := json.NewDecoder(res.Body).Decode(&pic); err != nil || res.StatusCode != 200 {
		t.Fatalf("picture: %d %v", res.StatusCode, err)
	}
	if n := pic.Cluster.Nodes; len(n) != 1 || n[0].Node != "agg-1" || !n[0].Reachable || n[0].ChainSeq != 6 || n[0].ChainHead != pic.Receipts.Head {
		t.Fatalf("cluster nodes: %+v (receipts head %s)", n, pic.Receipts.Head)
	}
	if pic.Viewer.Member != "alice" || pic.Viewer.Via != "certificate" || len(pic.Jobs) != 1 {
		t.Fatalf("picture: %+v", pic)
	}
	g := pic.Jobs[0].Grid
	if g == nil {
		t.Fatalf("no heatmap for a 3 × 2 sweep:\n%s", p.log.String())
	}
	filled := 0
	for _, c := range g.Cells {
		if c.Value != nil {
			filled++
		}
	}
	// The best: a = 3, b = 1 (score 2), shard 4 in the grid's order.
	if filled != 6 || g.Metric != "score" || g.Best < 0 || *g.Cells[g.Best].Value != 2 {
		t.Fatalf("heatmap: %d cells filled, metric %q, best %d: %+v", filled, g.Metric, g.Best, g.Cells)
	}
}
