package aggregator

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/trust"
)

// Law 13: nothing undecided is visible. A consortium job (two replicas)
// runs through three real workers while a researcher polls its status and
// follows its event stream; every control-plane response is recorded. Then
// every result hash any report carried is looked for in every response:
// it may appear only in a view of its shard already decided, in a
// shard-verified event, or in the answer to the peer that reported it.
func TestLaw13NothingUndecidedVisible(t *testing.T) {
	t.Parallel()
	const shards = 8
	rec := &apiRecorder{}
	p := newTestPool(t, trust.Consortium, 3, Options{LeaseTTL: 2 * time.Second, WrapAPI: rec.wrap})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plan, stop := p.startPiJob(ctx, "law13", shards*5000, shards, 3)
	defer stop()
	alice := p.client("alice")
	watched := make(chan error, 1)
	go func() { watched <- alice.Watch(ctx, plan.ID, func(api.Event) error { return nil }) }()
	// Poll the view while shards are undecided, as a curious member would.
	for {
		st, err := alice.Job(ctx, plan.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == coordinator.JobDone {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	final, _ := p.node.fsm.machine().Job(plan.ID)
	var hashes []content.Ref // every reported result (two shards may share one)
	for _, s := range final.Shards {
		for _, r := range s.Reports {
			hashes = append(hashes, r.Result)
		}
	}
	views := 0
	for _, ex := range rec.snapshot() {
		switch {
		case ex.method == "GET" && ex.path == "/v1/jobs/"+string(plan.ID):
			// Each view: an undecided shard shows no report's hash.
			views++
			var st coordinator.JobStatus
			if err := json.Unmarshal(ex.resp, &st); err != nil {
				t.Fatal(err)
			}
			for _, s := range st.Shards {
				if s.State == coordinator.StateVerified || s.State == coordinator.StateUnverified {
					continue
				}
				for _, r := range s.Reports {
					if r.Result != "" {
						t.Errorf("a job view shows %s's result %s of shard %d while it is %s", r.Peer, r.Result.Short(), s.Index, s.State)
					}
				}
			}
		case ex.method == "GET" && strings.HasSuffix(ex.path, "/events"):
			// The stream: a hash only in a decision.
			for _, block := range strings.Split(string(ex.resp), "\n\n") {
				for _, h := range hashes {
					if strings.Contains(block, string(h)) && !strings.HasPrefix(block, "event: shard-verified") {
						t.Errorf("the event stream carried %s outside a decision: %s", h.Short(), block)
					}
				}
			}
		case ex.method == "POST" && (ex.path == "/v1/results" || ex.path == "/v1/results/batch"):
			// The reporter's own answer (alone, or its items of a batch,
			// as workers send by default): it knows its result.
		default:
			for _, h := range hashes {
				if bytes.Contains(ex.resp, []byte(h)) {
					t.Errorf("%s %s carried the result hash %s", ex.method, ex.path, h.Short())
				}
			}
		}
	}
	if views < 2 {
		t.Fatalf("the recorder saw %d job views", views)
	}
}
