package main

import (
	"context"
	"testing"

	"github.com/scellis/scellis/content"
)

// A member's upload to the leader is copied to a second aggregator as
// soon as it is stored, before any report asks for it
// (aggregator/earlycopy.go): the report's durability check then waits for
// that copy instead of making one on the round's critical path. Real
// processes: three aggregators, a worker's credentials; the blob is
// uploaded to the leader alone and never reported, and a follower comes
// to hold it (before this change nothing copied a blob nobody reported).
func TestUploadCopiedToASecondAggregator(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c := newCluster(t, "own", 3, member{"w1", "worker"})
	c.startAggregators()
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	_, fed := c.memberKeys("w1")
	base := func(name string) string {
		m, ok := fed.Member(name)
		if !ok {
			t.Fatalf("no member %s", name)
		}
		return "https://" + m.Address
	}
	var leader string
	waitFor(t, "a leader named by the nodes", untilElected(), func() bool {
		leader = c.leader("agg-1")
		return leader != ""
	})
	b := []byte("a result nobody reported")
	if err := c.apiClient("w1").PutBlobTo(ctx, base(leader), b); err != nil {
		t.Fatal(err)
	}
	ref := content.Hash(b)
	agg := c.apiClient(leader)
	waitFor(t, "a copy of the upload on a second aggregator", untilNoticed(), func() bool {
		for _, a := range c.aggs {
			if a == leader {
				continue
			}
			if got, err := agg.GetBlobFrom(ctx, []string{base(a)}, ref); err == nil && string(got) == string(b) {
				return true
			}
		}
		return false
	})
}
