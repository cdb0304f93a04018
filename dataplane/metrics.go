package dataplane

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The data plane's series (docs/operations.md), read from the peer's
// counters at each scrape: bytes and connections by path, summed over the
// members this process moved blobs with (the per-pair figures are in
// status, where a federation's worth of labels does not weigh on the
// metrics store).
var (
	descBytes = prometheus.NewDesc("scellis_p2p_bytes_total",
		"Blob bytes moved with other members, both ways, by path: direct or relayed data channel, or the https fallback.", []string{"path"}, nil)
	descConns = prometheus.NewDesc("scellis_p2p_connections_total",
		"Data-channel connections made with other members (either side dialing), by path: direct or relayed.", []string{"path"}, nil)
	descLive = prometheus.NewDesc("scellis_p2p_connections",
		"Data-channel connections open now, by path: direct or relayed.", []string{"path"}, nil)
	descFailed = prometheus.NewDesc("scellis_p2p_failed_dials_total",
		"Connection attempts that found no path (transfers go over https meanwhile).", nil, nil)
	descFallbacks = prometheus.NewDesc("scellis_p2p_fallbacks_total",
		"Transfers that went over https because no data channel was up (being set up, failed or avoided) or the transfer failed on one.", nil, nil)
)

type collector struct{ p *Peer }

// Collector returns the Prometheus collector of p's counters; register it
// on the process's registry (internal/obs).
func (p *Peer) Collector() prometheus.Collector { return collector{p} }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBytes, descConns, descLive, descFailed, descFallbacks} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	var t PairStats
	for _, s := range c.p.Stats() {
		t.DirectBytes += s.DirectBytes
		t.RelayedBytes += s.RelayedBytes
		t.HTTPSBytes += s.HTTPSBytes
		t.DirectConns += s.DirectConns
		t.RelayedConns += s.RelayedConns
		t.FailedDials += s.FailedDials
		t.Fallbacks += s.Fallbacks
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descBytes, t.DirectBytes, PathDirect)
	counter(descBytes, t.RelayedBytes, PathRelayed)
	counter(descBytes, t.HTTPSBytes, PathHTTPS)
	counter(descConns, t.DirectConns, PathDirect)
	counter(descConns, t.RelayedConns, PathRelayed)
	counter(descFailed, t.FailedDials)
	counter(descFallbacks, t.Fallbacks)
	direct, relayed := c.p.live()
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(direct), PathDirect)
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(relayed), PathRelayed)
}
