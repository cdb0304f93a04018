package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// recordingApplier stands in for the leader's Raft: it records what it
// was asked to apply and answers with a refusal, to show that the
// outcome comes back to the follower as the leader's Apply gave it.
type recordingApplier struct{ got []coordinator.Command }

func (a *recordingApplier) Apply(_ context.Context, cmd coordinator.Command) (Applied, error) {
	a.got = append(a.got, cmd)
	return Applied{Refusal: diag.List{diag.New(diag.PoolNoLease, "shard", "not leased")}}, nil
}

// POST /v1/forward takes only a browser volunteer's own kinds of command,
// in a volunteer's name; everything else is refused before Raft.
func TestForwardTakesOnlyVolunteerWork(t *testing.T) {
	ap := &recordingApplier{}
	s := &Server{Apply: ap}
	vol := receipt.VolunteerPeer(receipt.KeyPrefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	job := content.Ref("sha256:" + string(bytes.Repeat([]byte("a"), 64)))
	send := func(cmd coordinator.Command) *httptest.ResponseRecorder {
		t.Helper()
		b, err := coordinator.EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(ForwardRequest{Command: b})
		r := httptest.NewRequestWithContext(identity.WithPeer(context.Background(), identity.PublicKey{}), "POST", "/v1/forward", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.forward(w, r)
		return w
	}
	for _, cmd := range []coordinator.Command{
		coordinator.Lease{Peer: "w1", Now: 1},                                 // a member's lease
		coordinator.ReportResult{Peer: "w1", Job: job, Shard: 0, Result: job}, // a member's report
		coordinator.CancelJob{Job: job, Peer: vol, Operator: true},            // not volunteer work
		coordinator.ReportReduced{Job: job, Peer: vol, Reduced: job, Now: 1},  // not volunteer work
	} {
		if w := send(cmd); w.Code != http.StatusForbidden {
			t.Errorf("%T forwarded: %d %s", cmd, w.Code, w.Body)
		}
	}
	if len(ap.got) != 0 {
		t.Fatalf("refused commands reached Apply: %v", ap.got)
	}
	w := send(coordinator.RenewLease{Peer: vol, Job: job, Shard: 3, Now: 1})
	var out Applied
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &out) != nil || len(out.Refusal) != 1 || out.Refusal[0].Code != diag.PoolNoLease {
		t.Fatalf("a volunteer's renewal: %d %s", w.Code, w.Body)
	}
	if len(ap.got) != 1 {
		t.Fatalf("applied %v", ap.got)
	}
	if got, ok := ap.got[0].(coordinator.RenewLease); !ok || got.Peer != vol || got.Shard != 3 {
		t.Fatalf("applied %#v", ap.got[0])
	}
}
