package silo

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/internal/obs"
)

// The silo's Prometheus series (docs/operations.md): its ledger's budget,
// spent and remaining ε per dataset, read from the ledger at scrape time
// (what another process appended included), and its rounds by outcome.
// Only names, counts and ε leave through them — never data or an update.
type siloMetrics struct {
	reg    *prometheus.Registry
	rounds *prometheus.CounterVec
	bytes  *prometheus.CounterVec
	// leases counts the shards the silo leased by kind, handedBack the
	// leases it gave back unreported: with generic shards off its policy,
	// no generic lease at all, and no hand-back churn.
	leases     *prometheus.CounterVec
	handedBack prometheus.Counter
}

func newSiloMetrics(a *Appliance) *siloMetrics {
	m := &siloMetrics{
		reg: obs.NewRegistry(),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scellis_silo_rounds_total", Help: "Round requests this silo answered, by outcome (contributed, resent: an update already paid for sent again, declined).",
		}, []string{"outcome"}),
	}
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scellis_data_plane_bytes_total", Help: "Bytes this silo sent (out) and received (in) in secure aggregation, bodies only.",
	}, []string{"plane", "direction"})
	m.leases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scellis_silo_leases_total", Help: "Shards this silo leased, by kind (round: its training rounds; generic: pool work, only with policy.generic_shards).",
	}, []string{"kind"})
	for _, k := range []coordinator.ShardKind{coordinator.KindRound, coordinator.KindGeneric} {
		m.leases.WithLabelValues(string(k)) // present at 0 before the first
	}
	m.handedBack = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "scellis_silo_leases_handed_back_total", Help: "Leases this silo handed back unreported (a failure before anything was charged or run), for another attempt.",
	})
	m.reg.MustRegister(m.rounds, m.bytes, m.leases, m.handedBack, ledgerCollector{a})
	return m
}

// countLease counts a shard of kind the silo leased.
func (m *siloMetrics) countLease(kind coordinator.ShardKind) {
	if m != nil {
		m.leases.WithLabelValues(string(kind)).Inc()
	}
}

// observeShard hears the silo's pool.Worker (Worker.Observe): a lease
// handed back is counted.
func (m *siloMetrics) observeShard(event string) {
	if m != nil && event == "released" {
		m.handedBack.Inc()
	}
}

// countTransport counts the secure aggregation traffic of the silo's client.
func (m *siloMetrics) countTransport(rt http.RoundTripper) http.RoundTripper {
	return obs.CountTransport(rt, m.bytes.WithLabelValues("secagg", "in"), m.bytes.WithLabelValues("secagg", "out"))
}

// countSecAgg counts secure-aggregation bodies moved over a data channel
// (those over HTTPS are counted by countTransport).
func (m *siloMetrics) countSecAgg(sent, received int) {
	m.bytes.WithLabelValues("secagg", "out").Add(float64(sent))
	m.bytes.WithLabelValues("secagg", "in").Add(float64(received))
}

// Metrics returns the silo's registry (what /metrics serves).
func (a *Appliance) Metrics() *prometheus.Registry { return a.metrics.reg }

func (a *Appliance) countRound(outcome string) {
	if a.metrics != nil {
		a.metrics.rounds.WithLabelValues(outcome).Inc()
	}
}

var (
	descBudget    = prometheus.NewDesc("scellis_ledger_budget_epsilon", "A dataset's privacy budget ε (at its δ) in the silo's ledger.", []string{"dataset"}, nil)
	descSpent     = prometheus.NewDesc("scellis_ledger_spent_epsilon", "The ε a dataset has spent, composed by the accountant.", []string{"dataset"}, nil)
	descRemaining = prometheus.NewDesc("scellis_ledger_remaining_epsilon", "The ε a dataset has left.", []string{"dataset"}, nil)
	descCharges   = prometheus.NewDesc("scellis_ledger_charges", "Charges recorded against a dataset.", []string{"dataset"}, nil)
)

type ledgerCollector struct{ a *Appliance }

func (c ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBudget
	ch <- descSpent
	ch <- descRemaining
	ch <- descCharges
}

func (c ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	if c.a.Ledger == nil {
		return
	}
	for _, d := range c.a.Config.Datasets {
		st, err := c.a.Ledger.Status(d.Name)
		if err != nil {
			continue // no budget declared (yet): nothing to show
		}
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, st.Budget, d.Name)
		ch <- prometheus.MustNewConstMetric(descSpent, prometheus.GaugeValue, st.Spent, d.Name)
		ch <- prometheus.MustNewConstMetric(descRemaining, prometheus.GaugeValue, st.Remaining, d.Name)
		ch <- prometheus.MustNewConstMetric(descCharges, prometheus.GaugeValue, float64(st.Charges), d.Name)
	}
}
