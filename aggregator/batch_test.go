package aggregator

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Batching workers (pool.Worker.Batch) through a real node: a consortium
// job (two replicas, commit–reveal, signed reports) run by two workers
// that lease several shards at once and send their commitments and
// reveals in batches. Every shard is verified by both peers, the
// receipts chain and carry both peers' signatures, the batch endpoints
// were used and the single ones were not. Then the batch endpoints'
// refusals: an oversized batch is refused whole, and a batch mixing good
// and bad items gets one answer per item, each bad one naming its item.
func TestBatchedWorkersJobCompletes(t *testing.T) {
	t.Parallel()
	const shards = 12
	rec := &apiRecorder{}
	p := newTestPool(t, trust.Consortium, 2, Options{LeaseTTL: 5 * time.Second, WrapAPI: rec.wrap})
	p.batch = 6
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plan, stop := p.startPiJob(ctx, "batched", shards*1000, shards, 2)
	defer stop()
	alice := p.client("alice")
	if _, err := p.waitDone(ctx, plan.ID); err != nil {
		t.Fatal(err)
	}
	st, err := p.node.fsm.machine().Job(plan.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Shards {
		if s.State != coordinator.StateVerified || len(s.Agreeing) != 2 {
			t.Errorf("shard %d: %s, agreeing %v; want verified by both workers", s.Index, s.State, s.Agreeing)
		}
	}
	rs, err := alice.Receipts(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := receipt.Verify(rs); err != nil {
		t.Fatalf("the receipt chain does not verify: %v", err)
	}
	keyOf := func(peer string) (string, bool) {
		m, ok := p.fed.Member(peer)
		return m.PublicKey.String(), ok
	}
	mine := 0
	for i := range rs {
		if rs[i].Job != plan.ID {
			continue
		}
		mine++
		if err := rs[i].VerifySignatures(keyOf); err != nil {
			t.Errorf("receipt %d: %v", rs[i].Seq, err)
		}
	}
	if mine != shards {
		t.Errorf("%d receipts for the job's %d shards", mine, shards)
	}
	calls := map[string]int{}
	for _, ex := range rec.snapshot() {
		calls[ex.method+" "+ex.path]++
	}
	if calls["POST /v1/commits/batch"] == 0 || calls["POST /v1/results/batch"] == 0 {
		t.Errorf("the batch endpoints were not used: %v", calls)
	}
	if calls["POST /v1/commits"]+calls["POST /v1/results"]+calls["POST /v1/renew"] > 0 {
		t.Errorf("batching workers used the single-shard endpoints: %v", calls)
	}

	// Hostile batches, from a worker's own client.
	w1 := p.client("w1")
	var many []api.ResultReport
	for i := range api.MaxBatch + 1 {
		many = append(many, api.ResultReport{Job: plan.ID, Shard: i % shards, Result: content.Hash([]byte("x"))})
	}
	_, err = w1.ReportBatch(ctx, many)
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolBadRequest {
		t.Errorf("a batch of %d reports: %v; want SC7102", len(many), err)
	}
	if _, err := w1.CommitBatch(ctx, nil); err == nil {
		t.Error("an empty batch of commitments was accepted")
	}
	other, err := w1.PutBlob(ctx, []byte("not a reported result")) // durable, so only the coordinator refuses
	if err != nil {
		t.Fatal(err)
	}
	_, err = w1.ReportBatch(ctx, []api.ResultReport{
		{Job: plan.ID, Shard: 0, Result: other},
		{Job: plan.ID, Shard: 1, Result: "sha256:nothex"},
	})
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolBadRequest || ds[0].Subject != "reports[1]" {
		t.Errorf("a batch with a malformed ref in item 1: %v; want SC7102 naming reports[1]", err)
	}
	items, err := w1.ReportBatch(ctx, []api.ResultReport{
		{Job: plan.ID, Shard: 0, Result: other, Nonce: "00"},
		{Job: content.Hash([]byte("no such job")), Shard: 0, Result: other},
		{Job: plan.ID, Shard: shards + 5, Result: other},
		{Job: plan.ID, Shard: 1, Result: st.Shards[1].Result}, // w1's own report again
	})
	if err != nil {
		t.Fatal(err)
	}
	// Item 0: w1 already reported shard 0, and differently now.
	for i, want := range []diag.Code{diag.PoolReportConflict, diag.PoolUnknownJob, diag.PoolUnknownShard} {
		if len(items[i].Refusal) == 0 || items[i].Refusal[0].Code != want {
			t.Errorf("item %d: %+v; want %s", i, items[i], want)
		}
	}
	if len(items[1].Refusal) > 0 && !strings.Contains(items[1].Refusal[0].Subject, "reports[1]") {
		t.Errorf("the unknown job's diagnostic does not name its item: %q", items[1].Refusal[0].Subject)
	}
	if items[3].Err() != nil {
		t.Errorf("repeating a report in a batch: %v; want the first answer again", items[3].Err())
	}
	renewed, err := w1.RenewBatch(ctx, []api.RenewRequest{{Job: plan.ID, Shard: 0}, {Job: content.Hash([]byte("no such job")), Shard: 0}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []diag.Code{diag.PoolLeaseNotLive, diag.PoolUnknownJob} {
		if len(renewed[i].Refusal) == 0 || renewed[i].Refusal[0].Code != want {
			t.Errorf("renewal %d: %+v; want %s", i, renewed[i], want)
		}
	}
	// Oversized bodies are cut off before decoding.
	big := strings.Repeat(" ", api.MaxBatchRequestBytes+1)
	self, _ := p.fed.Member("agg-1")
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+self.Address+"/v1/results/batch", strings.NewReader(big+`{"reports":[]}`))
	cfg, err := identity.ClientTLSConfig(p.ids["w1"], p.fed, "", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: api.Transport(cfg), Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("an oversized batch body: %s; want 413", resp.Status)
	}
}
