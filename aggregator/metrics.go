package aggregator

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/internal/obs"
)

// The node's Prometheus series (docs/operations.md lists them). Each node
// has its own registry: tests run several nodes in one process. The
// pool's counts (shards, jobs, runs, leases) and Raft's are read from the
// replica at scrape time, so every node reports them; the round series
// move on the node that drives the rounds, the leader.
type nodeMetrics struct {
	reg       *prometheus.Registry
	apply     prometheus.Histogram
	rounds    *prometheus.CounterVec
	roundTime *prometheus.HistogramVec
	phaseTime *prometheus.HistogramVec
	survivors prometheus.Histogram
	dropped   prometheus.Counter
	bytes     *prometheus.CounterVec
	// checkInputs and checkWait: the cross-checked reduction
	// (crosscheck.go) on the leader.
	checkInputs *prometheus.CounterVec
	checkWait   prometheus.Histogram
}

func newNodeMetrics(n *Node) *nodeMetrics {
	m := &nodeMetrics{
		reg: obs.NewRegistry(),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scellis_raft_apply_seconds", Help: "Time from proposing a command on the leader to its outcome from the state machine (commit latency plus apply).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scellis_fl_rounds_total", Help: "Federated rounds this node drove to an end, by step (stats, train, eval) and outcome (reduced, failed).",
		}, []string{"step", "outcome"}),
		roundTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scellis_fl_round_seconds", Help: "Wall time of a reduced round, from opening secure aggregation to the reduced model committed, by step.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 14),
		}, []string{"step"}),
		phaseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scellis_secagg_phase_seconds", Help: "Duration of each phase of the secure aggregation rounds this node hosted (silos advertise before they train: mask includes their local training and ledger charge).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"phase"}),
		survivors: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scellis_secagg_survivors", Help: "Silos whose masked inputs a secure aggregation round summed.",
			Buckets: prometheus.LinearBuckets(1, 1, 16),
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scellis_secagg_dropped_total", Help: "Silos that shared keys in a summed round but sent no input (their masks were removed).",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scellis_data_plane_bytes_total", Help: "Bytes of request (in) and response (out) bodies on the data plane: blobs and secure aggregation.",
		}, []string{"plane", "direction"}),
		checkInputs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scellis_fl_cross_check_inputs_total", Help: "Masked inputs of cross-checked rounds, by how the checking peer got them: forwarded as they arrived, or held and sent with the transcript.",
		}, []string{"how"}),
		checkWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "scellis_fl_cross_check_wait_seconds", Help: "How long the leader waited, after its own server step, for the checking peer's digest of a round.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	m.reg.MustRegister(m.apply, m.rounds, m.roundTime, m.phaseTime, m.survivors, m.dropped, m.bytes, m.checkInputs, m.checkWait, stateCollector{n})
	return m
}

// countPlane wraps a data-plane handler with its byte counters.
func (m *nodeMetrics) countPlane(plane string, h http.Handler) http.Handler {
	return obs.CountBytes(h, m.bytes.WithLabelValues(plane, "in"), m.bytes.WithLabelValues(plane, "out"))
}

func (m *nodeMetrics) phase(_ string, phase string, d time.Duration) {
	m.phaseTime.WithLabelValues(phase).Observe(d.Seconds())
}

// Metrics returns the node's registry (what /metrics serves).
func (n *Node) Metrics() *prometheus.Registry { return n.metrics.reg }

var (
	descRaftState   = prometheus.NewDesc("scellis_raft_state", "1 for this node's Raft role (follower, candidate, leader, shutdown), 0 for the others.", []string{"state"}, nil)
	descRaftTerm    = prometheus.NewDesc("scellis_raft_term", "This node's current Raft term.", nil, nil)
	descRaftCommit  = prometheus.NewDesc("scellis_raft_commit_index", "The last log index this node knows committed.", nil, nil)
	descRaftApplied = prometheus.NewDesc("scellis_raft_applied_index", "The last log index handed to the state machine.", nil, nil)
	descRaftContact = prometheus.NewDesc("scellis_raft_leader_contact_seconds", "How long ago this node heard from the leader (0 on the leader); absent when no leader is known.", nil, nil)
	descShards      = prometheus.NewDesc("scellis_shards", "Shards of running jobs by state (pending, leased, verified, unverified).", []string{"state"}, nil)
	descJobs        = prometheus.NewDesc("scellis_jobs", "Jobs by state.", []string{"state"}, nil)
	descRuns        = prometheus.NewDesc("scellis_runs", "Federated runs by state.", []string{"state"}, nil)
	descLeases      = prometheus.NewDesc("scellis_leases", "Live leases on shards of running jobs.", nil, nil)
)

// stateCollector reads Raft's and the pool's state at scrape time.
type stateCollector struct{ n *Node }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descRaftTerm, descRaftCommit, descRaftApplied, descRaftContact, descShards, descJobs, descRuns, descLeases} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	if n.raft != nil {
		st := n.raft.Status()
		for _, s := range []consensus.State{consensus.StateFollower, consensus.StateCandidate, consensus.StateLeader, consensus.StateShutdown} {
			v := 0.0
			if st.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, string(s))
		}
		ch <- prometheus.MustNewConstMetric(descRaftTerm, prometheus.GaugeValue, float64(st.Term))
		ch <- prometheus.MustNewConstMetric(descRaftCommit, prometheus.GaugeValue, float64(st.CommitIndex))
		ch <- prometheus.MustNewConstMetric(descRaftApplied, prometheus.GaugeValue, float64(st.AppliedIndex))
		if age, ok := n.raft.LeaderContact(); ok {
			ch <- prometheus.MustNewConstMetric(descRaftContact, prometheus.GaugeValue, age.Seconds())
		}
	}
	g := n.fsm.machine().Gauges()
	for _, s := range []coordinator.ShardState{coordinator.StatePending, coordinator.StateLeased, coordinator.StateVerified, coordinator.StateUnverified} {
		ch <- prometheus.MustNewConstMetric(descShards, prometheus.GaugeValue, float64(g.Shards[s]), string(s))
	}
	for s, k := range g.Jobs {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(k), string(s))
	}
	for s, k := range g.Runs {
		ch <- prometheus.MustNewConstMetric(descRuns, prometheus.GaugeValue, float64(k), string(s))
	}
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(g.Leases))
}
