package aggregator

import (
	"context"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// Lease kinds over the API, with a sweep waiting: a silo asking for its
// rounds alone is granted nothing, not even recorded in the log (its poll
// is answered from the replica, as an idle worker's is); generic work is
// granted to a request for it; an unknown kind is refused with a
// diagnostic, and an old client's request (no kinds) still gets every
// kind.
func TestLeaseKindsOverTheAPI(t *testing.T) {
	t.Parallel()
	p := startTestNode(t, trust.Own, []testMember{{"alice", identity.Researcher}, {"s1", identity.Silo}, {"w1", identity.Worker}}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plan := p.mustCompile(ctx, piJob("pi", 8000, 8))
	p.mustSubmit(ctx, plan)
	s1 := p.client("s1")
	if r, err := s1.Lease(ctx, api.LeaseRequest{Max: 4, Kinds: coordinator.Kinds{coordinator.KindRound}}); err != nil || len(r.Grants) != 0 {
		t.Fatalf("a lease of rounds alone with only a sweep waiting: %+v, %v", r, err)
	}
	for _, rec := range p.node.fsm.machine().Peers() {
		if rec.Peer == "s1" {
			t.Fatalf("s1's empty round poll went through the log: %+v", rec)
		}
	}
	_, err := s1.Lease(ctx, api.LeaseRequest{Max: 1, Kinds: coordinator.Kinds{"gpu"}})
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolBadRequest {
		t.Fatalf("an unknown kind: %v, want %s", err, diag.PoolBadRequest)
	}
	if r, err := s1.Lease(ctx, api.LeaseRequest{Max: 2, Kinds: coordinator.Kinds{coordinator.KindGeneric}}); err != nil || len(r.Grants) != 2 || r.Grants[0].Job != plan.ID {
		t.Fatalf("a lease of generic work: %+v, %v", r, err)
	}
	if r, err := p.client("w1").Lease(ctx, api.LeaseRequest{Max: 1}); err != nil || len(r.Grants) != 1 {
		t.Fatalf("an old client's lease (no kinds): %+v, %v", r, err)
	}
}
