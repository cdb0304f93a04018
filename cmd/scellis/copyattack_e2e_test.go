package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// memberKeys loads member name's identity and the cluster's federation
// file, for a test that plays a member by hand.
func (c *cluster) memberKeys(name string) (*identity.Identity, *identity.Federation) {
	c.t.Helper()
	id, _, err := identity.Load(filepath.Join(c.dir, name, "identity.key"), identity.LoadOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	fed, err := identity.LoadFederation(filepath.Join(c.dir, "federation.yaml"))
	if err != nil {
		c.t.Fatal(err)
	}
	return id, fed
}

// apiClient is a control-plane client authenticating as member name of
// the cluster, for a test that plays a member by hand.
func (c *cluster) apiClient(name string) *api.Client {
	c.t.Helper()
	cl, err := api.NewClient(c.memberKeys(name))
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func hasCode(err error, code diag.Code) bool {
	ds, ok := diag.As(err)
	return ok && ds[0].Code == code
}

// The copy attack through the real API against real processes: a lazy
// member leases shards of a consortium job (two replicas), watches the job
// view and the event stream for an honest worker's result to copy, and
// finds none — no undecided report's hash is shown to it, the result
// bytes are refused to it even when it names their hash, and a result
// reported without a commitment is refused. Left to guess, it earns
// nothing: on one shard it times out, on the other its blind guess loses.
func TestCopyAttackFails(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process copy-attack test")
	}
	c := newCluster(t, "consortium", 1, member{"w1", "worker"}, member{"w2", "worker"}, member{"lazy", "worker"}, member{"alice", "researcher"})
	c.startAggregators()
	id, err := content.ParseRef(strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("copy", 2))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	lazy, agg := c.apiClient("lazy"), c.apiClient("agg-1")

	// Everything the lazy member is streamed, from the start.
	var mu sync.Mutex
	var events []api.Event
	watched := make(chan error, 1)
	go func() {
		watched <- lazy.Watch(ctx, id, func(e api.Event) error {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
			return nil
		})
	}()

	grants, err := lazy.Lease(ctx, api.LeaseRequest{Max: 2})
	if err != nil || len(grants.Grants) != 2 {
		t.Fatalf("lazy lease: %+v %v", grants, err)
	}
	// On shard 1 the lazy member commits blind, to a guess.
	guess := content.Hash([]byte("a guess"))
	nonce := make([]byte, coordinator.NonceBytes)
	if _, err := lazy.Commit(ctx, api.CommitRequest{Job: id, Shard: 1, Commitment: coordinator.Commitment(guess, "lazy", id, 1, nonce)}); err != nil {
		t.Fatal(err)
	}
	c.startWorker("w1")

	// It waits until the honest worker has reported shard 0 and looks.
	var honest content.Ref
	waitFor(t, "w1 to report shard 0", untilNoticed(), func() bool {
		st, err := agg.Job(ctx, id)
		if err != nil {
			return false
		}
		for _, r := range st.Shards[0].Reports {
			if r.Peer == "w1" {
				honest = r.Result
			}
		}
		return honest != ""
	})
	st, err := lazy.Job(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Shards[0].State == coordinator.StateVerified {
		t.Fatal("shard 0 was decided before the lazy member looked")
	}
	view, _ := json.Marshal(st)
	if strings.Contains(string(view), string(honest)) || len(st.Shards[0].Reports) == 0 || st.Shards[0].Reports[0].Result != "" {
		t.Fatalf("the job view shows the lazy member an undecided report's hash:\n%s", view)
	}
	// Even naming the hash (learnt elsewhere), the bytes are refused to it
	// while the shard is undecided; the aggregators read them.
	if _, err := lazy.GetBlob(ctx, honest); !hasCode(err, diag.PoolForbidden) {
		t.Fatalf("lazy read an undecided result's bytes: %v", err)
	}
	if _, err := agg.GetBlob(ctx, honest); err != nil {
		t.Fatalf("an aggregator cannot read the result: %v", err)
	}
	// The old attack — report the copied hash outright — is refused, and
	// so is a reveal of a hash it did not commit to.
	if _, err := lazy.Report(ctx, api.ResultReport{Job: id, Shard: 0, Result: honest}); !hasCode(err, diag.PoolNoCommitment) {
		t.Fatalf("a report without a commitment: %v", err)
	}
	if _, err := lazy.Report(ctx, api.ResultReport{Job: id, Shard: 1, Result: honest, Nonce: hex.EncodeToString(nonce)}); !hasCode(err, diag.PoolRevealMismatch) && !hasCode(err, diag.PoolRevealEarly) {
		t.Fatalf("a reveal that does not open the commitment: %v", err)
	}
	// Left with its guess, it uploads it and reveals it once shard 1's
	// reveal is open.
	if _, err := lazy.PutBlob(ctx, []byte("a guess")); err != nil {
		t.Fatal(err)
	}
	// Its reveal unsigned is refused by the state machine (SC7305); signed
	// with its identity key, as a worker signs, it is accepted.
	reveal := api.ResultReport{Job: id, Shard: 1, Result: guess, Nonce: hex.EncodeToString(nonce)}
	waitFor(t, "shard 1's reveal to open", untilNoticed(), func() bool {
		_, err := lazy.Report(ctx, reveal)
		if err == nil || (!hasCode(err, diag.PoolRevealEarly) && !hasCode(err, diag.VerifyBadSignature)) {
			t.Fatalf("lazy's unsigned reveal: %v", err)
		}
		return hasCode(err, diag.VerifyBadSignature)
	})
	lazyID, _ := c.memberKeys("lazy")
	reveal.Sig = identity.Sign(lazyID, identity.PurposeResult, coordinator.StatementOf(id, 1, guess, coordinator.Policy{}, "lazy").Bytes())
	if _, err := lazy.Report(ctx, reveal); err != nil {
		t.Fatalf("lazy's signed reveal: %v", err)
	}
	c.startWorker("w2")
	waitFor(t, "the job to complete", untilRun(), func() bool { return c.status("alice", id.String()).State == "done" })

	done := c.status("alice", id.String())
	for _, s := range done.Shards {
		if s.State != "verified" || strings.Join(s.Agreeing, ",") != "w1,w2" {
			t.Errorf("shard %d: %s by %v, want verified by w1 and w2", s.Index, s.State, s.Agreeing)
		}
	}
	if strings.Join(done.Shards[1].Losers, ",") != "lazy" {
		t.Errorf("shard 1 losers %v, want the lazy member", done.Shards[1].Losers)
	}
	contrib, err := lazy.Contributions(ctx)
	if err != nil || contrib["lazy"] != 0 || contrib["w1"] == 0 {
		t.Fatalf("contributions %v %v: the lazy member earned work units", contrib, err)
	}
	peers, err := lazy.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		if p.Peer == "lazy" && (p.Expired == 0 || p.Lost != 1 || p.Won != 0) {
			t.Fatalf("lazy's record %+v: want timed out, one loss, no win", p)
		}
	}
	// The stream never carried an undecided report's hash to it.
	if err := <-watched; err != nil {
		t.Fatalf("watch: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	reports := 0
	for _, e := range events {
		if e.Kind != "result-reported" {
			continue
		}
		reports++
		var r coordinator.ResultReported
		if err := json.Unmarshal(e.Data, &r); err != nil || r.Result != "" {
			t.Errorf("a result-reported event shows the lazy member a hash: %s", e.Data)
		}
	}
	if reports < 4 {
		t.Errorf("the lazy member saw %d result-reported events, want at least 4", reports)
	}
}
