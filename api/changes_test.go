package api

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
)

// A federation's membership history is served in pages of ChangesPage,
// and SyncMembership follows all of it: 600 signed changes come in three
// requests, each answer bounded, and the member ends with every change
// applied (each still verified against the membership before it).
func TestMembershipChangesPaged(t *testing.T) {
	seed := func(b byte) *identity.Identity {
		var s [ed25519.SeedSize]byte
		s[0] = b
		return identity.NewFromSeed(s)
	}
	agg, ops, w1, w2 := seed(1), seed(2), seed(3), seed(4)
	fedText := fmt.Sprintf(`federation: f
regime: own
members:
  - {name: agg-1, role: aggregator, public_key: %s, address: "127.0.0.1:1", raft_address: "127.0.0.1:2"}
  - {name: ops, role: operator, public_key: %s}
`, agg.Public(), ops.Public())
	parse := func() *identity.Federation {
		f, err := identity.ParseFederation("f.yaml", []byte(fedText))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	const total = 600
	var all [][]byte
	for i := range total {
		c := identity.Change{Federation: "f", Seq: i, Name: "w", Operator: "ops"}
		switch {
		case i == 0:
			c.Op, c.Role, c.PublicKey = identity.OpAdd, identity.Worker, w1.Public().String()
		case i%2 == 1:
			c.Op, c.PublicKey = identity.OpRotate, w2.Public().String()
		default:
			c.Op, c.PublicKey = identity.OpRotate, w1.Public().String()
		}
		sc, err := identity.SignChange(ops, c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := content.Encode(sc)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b)
	}
	s := &Server{Fed: parse(), Changes: func() [][]byte { return all }}
	var requests, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		rec := httptest.NewRecorder()
		s.changes(rec, r)
		var resp ChangesResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err == nil && int32(len(resp.Changes)) > most.Load() {
			most.Store(int32(len(resp.Changes)))
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()
	c := NewClientTLS(http.DefaultTransport, []string{srv.URL})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	member := parse()
	n, err := SyncMembership(ctx, c, member)
	if err != nil || n != total || member.Applied() != total {
		t.Fatalf("applied %d (%d in all), err %v; want %d", n, member.Applied(), err, total)
	}
	if got, want := requests.Load(), int32((total+ChangesPage-1)/ChangesPage); got != want {
		t.Errorf("%d requests, want %d pages", got, want)
	}
	if most.Load() > ChangesPage {
		t.Errorf("one answer carried %d changes, over the page of %d", most.Load(), ChangesPage)
	}
	if m, ok := member.Lookup(w2.Public()); !ok || m.Name != "w" { // 599 is odd: w's key is w2
		t.Errorf("after the last change w should hold w2's key: %v %v", m, ok)
	}
}
