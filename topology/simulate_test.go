package topology

import (
	"context"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
)

// The fan-out simulation of issue 22: flat against tree over 10^3 and
// 10^4 silos (10^5 takes seconds of Starlark: scellis topology simulate
// prints it, and docs/topology.md has the table). Each count is checked
// against a closed form computed independently of Simulate's walk.
func TestSimulateFanOut(t *testing.T) {
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	flat, _ := Resolve(c, "flat", "")
	tree, _ := Resolve(c, "tree", "")
	const replicas = 2
	round, shard, job := int64(len(RoundExchanges)), int64(len(ShardExchanges)), int64(len(JobExchanges))
	var sims []Simulation
	for _, n := range []int{1_000, 10_000} {
		shards := n
		f, err := SimulateSynthetic(context.Background(), c, flat, nil, 3, n, shards, replicas)
		if err != nil {
			t.Fatal(err)
		}
		if f.Clusters != 1 || f.Root.Round != round*int64(n) || f.Root.Job != shard*replicas*int64(shards)+job*int64(n) {
			t.Fatalf("flat %d: %+v", n, f)
		}
		sims = append(sims, f)
		for _, fanout := range []int{32, 100} {
			s, err := SimulateSynthetic(context.Background(), c, tree, map[string]any{"fanout": int64(fanout)}, 3*ClustersFor(n, fanout), n, shards, replicas)
			if err != nil {
				t.Fatal(err)
			}
			// Every silo is charged once, every non-root cluster's
			// relay twice (at its parent and towards it).
			if want := round*int64(n) + int64(len(ChildRoundExchanges))*int64(2*(s.Clusters-1)); s.TotalRound != want {
				t.Errorf("tree %d/%d: total per round %d, want %d", n, fanout, s.TotalRound, want)
			}
			if s.MaxFanOut > fanout || s.BusiestRound.Round > round*int64(fanout+1) {
				t.Errorf("tree %d/%d: fan-out %d, busiest %+v", n, fanout, s.MaxFanOut, s.BusiestRound)
			}
			if s.Clusters != ClustersFor(n, fanout) || s.TotalJob <= f.TotalJob || s.BusiestJob.Job >= f.Root.Job {
				t.Errorf("tree %d/%d: %+v against flat %+v", n, fanout, s, f)
			}
			sims = append(sims, s)
		}
	}
	var b strings.Builder
	if err := WriteTable(&b, sims); err != nil {
		t.Fatal(err)
	}
	t.Logf("exchanges per coordinator cluster leader (round: one federated round; job: one pool job, shards = members, %d replicas)\n%s", replicas, b.String())
}
