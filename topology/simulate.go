package topology

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/identity"
)

// Exchange is one request and its answer between a member (or a child
// cluster) and the coordinator cluster leading it, with the code that
// makes it, so that the model can be checked against the code.
type Exchange struct {
	What  string `json:"what"`
	Where string `json:"where"`
}

// RoundExchanges are the exchanges one silo makes with its cluster in one
// federated round with secure aggregation, read off the round path. Not
// counted: lease renewals (one per renewal interval of a long round), the
// run spec (fetched once per run), retries and long-poll reconnects, and
// Raft replication among the cluster's nodes.
var RoundExchanges = []Exchange{
	{"lease the round's shard (long poll)", "pool.Worker.Run → api.Client.Lease"},
	{"read the round job's status", "silo.Appliance.Dispatch → api.Client.Job"},
	{"fetch the round bundle", "silo.Appliance.round → GetBlob(st.Bundle)"},
	{"fetch the global model", "silo.Appliance.round → GetBlob(from)"},
	{"send the key advert", "secagg/wire.ParticipateOver → stageAdvert"},
	{"fetch the key set", "secagg/wire.ParticipateOver → keyset"},
	{"send the encrypted shares", "secagg/wire.ParticipateOver → stageShares"},
	{"fetch the share delivery", "secagg/wire.ParticipateOver → deliveries/SITE"},
	{"send the masked input", "secagg/wire.ParticipateOver → stageMasked"},
	{"fetch the unmask request", "secagg/wire.ParticipateOver → unmask"},
	{"send the unmasking", "secagg/wire.ParticipateOver → stageUnmasking"},
	{"upload the signed contribution", "pool.Worker.Deliver → putResult"},
	{"report the contribution's hash", "pool.Worker.Deliver → report"},
}

// ShardExchanges are the exchanges one replica of one pool shard costs
// its executor: lease, commit (jobs of two or more replicas), upload,
// report (the reveal). Not counted: batching (one lease may grant several
// shards, one commit or report request may carry several), early-reveal
// polls and lease renewals.
var ShardExchanges = []Exchange{
	{"lease the shard (long poll)", "pool.Worker.Run → api.Client.Lease"},
	{"commit to the result's hash", "pool.Worker.Deliver → commitOne"},
	{"upload the result", "pool.Worker.Deliver → putResult"},
	{"report (reveal) the result", "pool.Worker.Deliver → report"},
}

// JobExchanges are the exchanges a member makes once per pool job it
// executes shards of: the job's status and its bundle (then cached).
var JobExchanges = []Exchange{
	{"read the job's status", "pool.Worker.RunGrant → api.Client.Job"},
	{"fetch the job bundle", "pool.Worker → GetBlob(st.Bundle)"},
}

// ChildRoundExchanges are the exchanges one child cluster makes with its
// parent in one hierarchical round, read off the delegate loop
// (aggregator/delegate_round.go): a child relays its sub-cohort's masked
// partial sum upward, it does not take part as a silo would. Not counted,
// as for silos: renewals, retries, the run spec (copied once per run) and
// the child's heartbeats (one held exchange per child node per half
// silo_lease, whatever the rounds; docs/tree.md).
var ChildRoundExchanges = []Exchange{
	{"lease the sub-cohort's shards", "aggregator.delegator → api.Client.Lease"},
	{"fetch the round bundle", "aggregator.delegator.parentRound → copyBlob(st.Bundle)"},
	{"fetch the global model", "aggregator.delegator.parentRound → copyBlob(b.Global)"},
	{"send the child's signed outer key", "aggregator.delegator → wire.PostOuterKey"},
	{"fetch the other children's outer keys", "aggregator.delegator → wire.FetchOuterKeys"},
	{"forward the masked partial sum", "aggregator.delegator.forward → wire.Forward"},
	{"upload the silos' contribution records", "aggregator.delegator.upload → api.Client.PutBlobs"},
	{"report the sub-job's shards", "aggregator.delegator → api.Client.ReportBatch"},
}

// DelegationJobExchanges are the exchanges a child cluster makes with its
// parent once per pool job it takes shards of (then cached), as a worker
// does (JobExchanges).
var DelegationJobExchanges = []Exchange{
	{"read the job's status", "aggregator.delegator.parentJob → api.Client.Job"},
	{"fetch the job bundle", "aggregator.delegator.parentJob → copyBlob(st.Bundle)"},
}

// DelegationBatchExchanges are the exchanges a child cluster makes with
// its parent per sub-job: a range of at most DelegateBatch shards, leased
// at once, whose verified results go up in one upload and one report.
var DelegationBatchExchanges = []Exchange{
	{"lease a range of shards", "aggregator.delegator → api.Client.Lease{Max: delegate_batch}"},
	{"upload the range's results", "aggregator.delegator.upload → api.Client.PutBlobs"},
	{"report the range's results", "aggregator.delegator → api.Client.ReportBatch"},
}

// DelegateBatch is the shards per sub-job the model assumes: the
// aggregator's default delegate_batch.
const DelegateBatch = 50

// Load is what one cluster's leader serves under a plan.
type Load struct {
	Cluster  string `json:"cluster"`
	Depth    int    `json:"depth"`
	Led      int    `json:"led"`      // silos and workers it leads
	Children int    `json:"children"` // child clusters
	// Round is the exchanges its leader serves in one federated round:
	// RoundExchanges per silo it leads, ChildRoundExchanges per child
	// cluster, plus its own towards its parent.
	Round int64 `json:"round"`
	// Job is the exchanges its leader serves in one pool job: per
	// replica of each shard its members execute, ShardExchanges; per
	// member executing any, JobExchanges; per child, and towards its
	// parent, DelegationJobExchanges and DelegationBatchExchanges per
	// DelegateBatch shards of the child's subtree.
	Job int64 `json:"job"`
}

// Simulation is the control fan-out of one plan: per-cluster loads and
// the figures a table reports.
type Simulation struct {
	Topology  string `json:"topology"`
	Params    string `json:"params,omitempty"` // k=v, sorted
	Members   int    `json:"members"`          // silos and workers
	Shards    int    `json:"shards"`
	Replicas  int    `json:"replicas"`
	Clusters  int    `json:"clusters"`
	Depth     int    `json:"depth"`
	MaxFanOut int    `json:"max_fanout"`
	Root      Load   `json:"root"`
	// BusiestRound and BusiestJob are the clusters whose leaders serve
	// the most exchanges per round and per job.
	BusiestRound Load `json:"busiest_round"`
	BusiestJob   Load `json:"busiest_job"`
	// TotalRound and TotalJob sum every cluster's load: a tree spreads
	// the work, it does not remove any.
	TotalRound int64  `json:"total_round"`
	TotalJob   int64  `json:"total_job"`
	Loads      []Load `json:"-"`
}

// Simulate counts, without any network, the exchanges each cluster's
// leader serves per federated round and per pool job of shards shards
// with replicas replicas each, spread over the silos and workers in
// proportion to how many each cluster leads.
func Simulate(p *Plan, shards, replicas int) Simulation {
	perShard := int64(len(ShardExchanges))
	if replicas < 2 {
		perShard-- // a one-replica shard is decided by its report: no commit
	}
	executors := 0
	for _, c := range p.Clusters {
		executors += len(c.Leads)
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(p.Params)) {
		kv = append(kv, fmt.Sprintf("%s=%v", k, p.Params[k]))
	}
	s := Simulation{Topology: p.Topology, Params: strings.Join(kv, " "), Members: executors, Shards: shards, Replicas: replicas,
		Clusters: len(p.Clusters), Depth: p.Depth(), MaxFanOut: p.MaxFanOut()}
	given := 0 // shards handed out so far, so the shares sum to shards exactly
	seen := 0
	mine := make(map[string]int, len(p.Clusters)) // shards its own members execute
	byName := make(map[string]*Cluster, len(p.Clusters))
	for i := range p.Clusters {
		c := &p.Clusters[i]
		byName[c.Name] = c
		seen += len(c.Leads)
		if executors > 0 {
			mine[c.Name] = shards*seen/executors - given
		}
		given += mine[c.Name]
	}
	// A child takes its whole subtree's shards from its parent, one
	// sub-job of at most DelegateBatch shards at a time.
	var subtree func(c *Cluster) int
	subtree = func(c *Cluster) int {
		n := mine[c.Name]
		for _, ch := range c.Children {
			if cc := byName[ch]; cc != nil {
				n += subtree(cc)
			}
		}
		return n
	}
	delegation := func(c *Cluster) int64 {
		n := subtree(c)
		if n == 0 {
			return 0
		}
		return int64(len(DelegationJobExchanges)) + int64(len(DelegationBatchExchanges))*int64((n+DelegateBatch-1)/DelegateBatch)
	}
	for i := range p.Clusters {
		c := &p.Clusters[i]
		l := Load{Cluster: c.Name, Depth: c.Depth, Led: len(c.Leads), Children: len(c.Children)}
		up, upJob := int64(0), int64(0)
		if c.Parent != "" {
			up, upJob = int64(len(ChildRoundExchanges)), delegation(c)
		}
		l.Round = int64(len(RoundExchanges))*int64(len(c.SubCohort)) + int64(len(ChildRoundExchanges))*int64(len(c.Children)) + up
		busy := min(len(c.Leads), mine[c.Name]*replicas) // members executing at least one replica
		l.Job = perShard*int64(mine[c.Name])*int64(replicas) + int64(len(JobExchanges))*int64(busy) + upJob
		for _, ch := range c.Children {
			if cc := byName[ch]; cc != nil {
				l.Job += delegation(cc)
			}
		}
		s.Loads = append(s.Loads, l)
		s.TotalRound += l.Round
		s.TotalJob += l.Job
		if l.Round > s.BusiestRound.Round {
			s.BusiestRound = l
		}
		if l.Job > s.BusiestJob.Job {
			s.BusiestJob = l
		}
	}
	s.Root = s.Loads[0]
	return s
}

// Synthetic returns a federation of aggregators, silos and workers with
// generated names (agg-000001, silo-000001, worker-000001), for
// simulations.
func Synthetic(aggregators, silos, workers int) []Member {
	out := make([]Member, 0, aggregators+silos+workers)
	for _, g := range []struct {
		n      int
		prefix string
		role   identity.Role
	}{{aggregators, "agg", identity.Aggregator}, {silos, "silo", identity.Silo}, {workers, "worker", identity.Worker}} {
		for i := range g.n {
			out = append(out, Member{Name: fmt.Sprintf("%s-%06d", g.prefix, i+1), Role: g.role})
		}
	}
	return out
}

// ClustersFor bounds how many clusters a tree of the given fan-out needs
// over n members: ceil(n/f) leaves, ceil(leaves/f) above them, and so on
// up to one root. Simulations give each cluster three aggregators from it.
func ClustersFor(n, fanout int) int {
	if fanout < 2 || n <= fanout {
		return 1
	}
	total := 0
	for k := n; k > 1; {
		k = (k + fanout - 1) / fanout
		total += k
	}
	return total
}

// SimulateSynthetic evaluates e over Synthetic(aggregators, silos, 0) and
// simulates the plan (see Simulate); the silos also execute the pool
// job's shards.
func SimulateSynthetic(ctx context.Context, c *catalog.Catalog, e *catalog.Entry, params map[string]any, aggregators, silos, shards, replicas int) (Simulation, error) {
	members := Synthetic(aggregators, silos, 0)
	p, err := Evaluate(ctx, c, e, members, params)
	if err != nil {
		return Simulation{}, err
	}
	return Simulate(p, shards, replicas), nil
}

// WriteTable writes simulations as a text table, one row each.
func WriteTable(w io.Writer, sims []Simulation) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "members\ttopology\tclusters\tdepth\tmax fan-out\tround: root\tround: busiest\tround: all\tjob: root\tjob: busiest\tjob: all\t")
	for _, s := range sims {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", s.Members, s.label(), s.Clusters, s.Depth, s.MaxFanOut,
			s.Root.Round, s.BusiestRound.Round, s.TotalRound, s.Root.Job, s.BusiestJob.Job, s.TotalJob)
	}
	return tw.Flush()
}

// label names the topology and its parameters in a table row.
func (s Simulation) label() string {
	if s.Params == "" {
		return s.Topology
	}
	return s.Topology + " " + s.Params
}
