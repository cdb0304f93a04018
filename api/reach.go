package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/scellis/scellis/diag"
)

// Reachability between aggregators. Raft traffic is the leader's to start:
// it dials its followers and they answer on its connections, so a leader
// whose inbound ports are cut off (an asymmetric partition) goes on
// leading while nobody can reach its API — not the silos, whose polls are
// its liveness evidence, nor the followers that redirect them to it. It
// cannot see that from inside; it asks its followers, over connections it
// opens itself, whether they can open one to it (a TCP connection: GET
// /v1/cluster/reach/{name}, aggregators only; package aggregator,
// ingress.go, decides what follows).

// ReachResponse answers GET /v1/cluster/reach/{name}: whether the
// answering node (From) opened a TCP connection to aggregator Node's API
// address, and how long it took or why it failed.
type ReachResponse struct {
	From    string `json:"from"`
	Node    string `json:"node"`
	Reached bool   `json:"reached"`
	Millis  int64  `json:"ms"`
	Error   string `json:"error,omitempty"`
}

// reachTimeout bounds how long a node tries to reach another for a
// caller (query timeout_ms; default 2 s, at most 10 s).
func reachTimeout(r *http.Request) time.Duration {
	ms, err := strconv.Atoi(r.URL.Query().Get("timeout_ms"))
	if err != nil || ms <= 0 {
		return 2 * time.Second
	}
	return min(time.Duration(ms)*time.Millisecond, 10*time.Second)
}

// reach serves GET /v1/cluster/reach/{name}.
func (s *Server) reach(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if s.Reach == nil {
		writeDiag(w, http.StatusNotImplemented, diag.New(diag.PoolBadRequest, "cluster", "this node does not probe other nodes"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), reachTimeout(r))
	defer cancel()
	began := time.Now()
	err := s.Reach(ctx, name)
	if ds, ok := diag.As(err); ok {
		writeDiags(w, http.StatusBadRequest, ds)
		return
	}
	out := ReachResponse{From: s.selfName(), Node: name, Reached: err == nil, Millis: time.Since(began).Milliseconds()}
	if err != nil {
		out.Error = err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

// selfName is this node's name as the status names it ("" if unknown).
func (s *Server) selfName() string {
	if s.Fresh == nil {
		return ""
	}
	return s.Fresh().Node
}

// ReachFrom asks the node at base whether it can reach aggregator node's
// API within timeout, without failing over to another node: the question
// is about that node's path. The call itself gets the timeout plus one
// attempt's deadline.
func (c *Client) ReachFrom(ctx context.Context, base, node string, timeout time.Duration) (ReachResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+c.attemptTimeout())
	defer cancel()
	u := base + "/v1/cluster/reach/" + url.PathEscape(node) + "?timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return ReachResponse{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return ReachResponse{}, err
	}
	var out ReachResponse
	return out, readResponse(resp, &out)
}
