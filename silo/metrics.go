package silo

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

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
	m.reg.MustRegister(m.rounds, m.bytes, ledgerCollector{a})
	return m
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
