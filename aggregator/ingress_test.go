package aggregator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// GET /v1/cluster/reach/{name} through real mutual TLS: the node opens a
// connection to the named aggregator's API (here its own) and says so; a
// name that is not an aggregator is refused with SC7102. A single node has
// no other voter to ask, so it is never cut off.
func TestReachEndpoint(t *testing.T) {
	t.Parallel()
	p := startTestNode(t, trust.Own, []testMember{{"alice", identity.Researcher}}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	self, _ := p.fed.Member("agg-1")
	c := p.client("agg-1")
	r, err := c.ReachFrom(ctx, "https://"+self.Address, "agg-1", time.Second)
	if err != nil || !r.Reached || r.From != "agg-1" || r.Node != "agg-1" || r.Error != "" {
		t.Fatalf("reach agg-1 from agg-1: %+v %v", r, err)
	}
	if _, err := c.ReachFrom(ctx, "https://"+self.Address, "alice", time.Second); err == nil || !strings.Contains(err.Error(), string(diag.PoolBadRequest)) {
		t.Fatalf("reach a researcher: %v, want %s", err, diag.PoolBadRequest)
	}
	if cut, detail := p.node.unheard(ctx); cut || detail != "no other voter" {
		t.Fatalf("a single node found itself cut off: %v %s", cut, detail)
	}
}
