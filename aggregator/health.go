package aggregator

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/obs"
)

// The health endpoints serve plain HTTP on their own address (health_listen)
// so a load balancer, systemd or a monitoring probe can ask without a
// federation key: they say only whether the process serves and whether its
// replica is current, nothing about jobs or members.
//
//	GET /healthz  200 while the process serves
//	GET /readyz   200 when this node is the leader or has heard from one
//	              within the stale bound, and has caught up (catchup.go);
//	              503 with the reason otherwise

// healthState is the body of /readyz.
type healthState struct {
	Node            string `json:"node"`
	Ready           bool   `json:"ready"`
	Leader          string `json:"leader,omitempty"`
	AppliedIndex    uint64 `json:"applied_index"`
	LeaderContactMs int64  `json:"leader_contact_ms"`
	Reason          string `json:"reason,omitempty"`
}

func (n *Node) healthHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		info := n.readInfo()
		leader, _, _ := n.leader()
		st := healthState{Node: n.Self.Name, Ready: !info.Stale, Leader: leader, AppliedIndex: info.AppliedIndex, LeaderContactMs: info.LeaderContactMs}
		code := http.StatusOK
		switch {
		case info.CatchingUp:
			code = http.StatusServiceUnavailable
			st.Reason = "catching up: the node has not yet applied what the cluster had committed when it reached the leader"
		case info.Stale:
			code = http.StatusServiceUnavailable
			st.Reason = "no leader heard from recently: an election is running, or this node is cut off from a majority"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(st)
	})
	return mux
}

// startObservers serves the health endpoints on healthAddr and /metrics on
// metricsAddr until Close; either may be empty (off). The same address for
// both is one listener serving the three paths: one port to open to the
// monitoring host. Different ones let an operator give /readyz to a load
// balancer while /metrics — job, run and ledger counts — stays on
// loopback or the monitoring network.
func (n *Node) startObservers(healthAddr, metricsAddr string) error {
	if metricsAddr != "" && metricsAddr != healthAddr {
		srv, err := obs.Listen(metricsAddr, obs.Handler(n.metrics.reg), n.log)
		if err != nil {
			return diag.New(diag.WorkerConfig, "metrics_listen", "cannot listen on %s: %v", metricsAddr, err).
				WithHelp("another process holds the port, or the address is not this machine's")
		}
		n.metricsSrv = srv
	}
	if healthAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", healthAddr)
	if err != nil {
		return diag.New(diag.WorkerConfig, "health_listen", "cannot listen on %s: %v", healthAddr, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	h := n.healthHandler()
	if metricsAddr == healthAddr {
		h.Handle("GET /metrics", obs.Handler(n.metrics.reg))
	}
	n.health = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, ErrorLog: obs.HTTPErrorLog(n.log)}
	n.done.Add(1)
	go func() {
		defer n.done.Done()
		if err := n.health.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("health server", "err", err)
		}
	}()
	return nil
}
