package api

import (
	"net/http"
	"slices"
	"strings"

	"github.com/scellis/scellis/identity"
)

// Endpoint is one route of an aggregator's HTTP surface and the roles that
// may call it. Every route is behind mutual TLS pinned to the federation
// file; Roles narrows it further (empty: every member).
type Endpoint struct {
	Method string
	Path   string
	Roles  []identity.Role
}

// String is "METHOD /path".
func (e Endpoint) String() string { return e.Method + " " + e.Path }

// Allows reports whether a member with role r may call e.
func (e Endpoint) Allows(r identity.Role) bool {
	return len(e.Roles) == 0 || slices.Contains(e.Roles, r)
}

var (
	people    = []identity.Role{identity.Researcher}
	executors = []identity.Role{identity.Worker, identity.Silo, identity.Cluster}
)

// Endpoints lists every route an aggregator serves, with who may call it:
// the control plane (Handler), the blob endpoint (blob.Handler, mounted
// by the aggregator with BlobReadable deciding reads of result bytes) and
// a training round's cross-check (CrossCheckPath).
// docs/api.md and SECURITY.md list the same table; a test keeps them true.
func Endpoints() []Endpoint {
	return []Endpoint{
		{"POST", "/v1/jobs", people},
		{"GET", "/v1/jobs", nil},
		{"GET", "/v1/jobs/{id}", nil},
		{"GET", "/v1/jobs/{id}/events", nil},
		{"POST", "/v1/jobs/{id}/cancel", []identity.Role{identity.Researcher, identity.Operator}},
		{"POST", "/v1/runs", people},
		{"GET", "/v1/runs", nil},
		{"GET", "/v1/runs/{id}", nil},
		{"GET", "/v1/runs/{id}/model", nil},
		{"POST", "/v1/runs/{id}/cancel", []identity.Role{identity.Researcher, identity.Operator}},
		{"POST", "/v1/runs/{id}/resume", []identity.Role{identity.Researcher, identity.Operator}},
		{"POST", "/v1/lease", executors},
		{"POST", "/v1/renew", executors},
		{"POST", "/v1/release", executors},
		{"POST", "/v1/commits", executors},
		{"POST", "/v1/results", executors},
		{"POST", "/v1/commits/batch", executors},
		{"POST", "/v1/results/batch", executors},
		{"POST", "/v1/renew/batch", executors},
		{"POST", "/v1/reduced", []identity.Role{identity.Aggregator}},
		{"POST", "/v1/forward", []identity.Role{identity.Aggregator}},
		{"GET", "/v1/receipts", nil},
		{"GET", "/v1/contributions", nil},
		{"GET", "/v1/peers", nil},
		{"POST", "/v1/peers/{name}/readmit", []identity.Role{identity.Operator}},
		{"GET", "/v1/status", nil},
		{"POST", "/v1/cluster/join", []identity.Role{identity.Aggregator, identity.Operator}},
		{"POST", "/v1/cluster/leave", []identity.Role{identity.Aggregator, identity.Operator}},
		{"GET", "/v1/cluster/reach/{name}", []identity.Role{identity.Aggregator}},
		{"POST", "/v1/federation/changes", []identity.Role{identity.Operator}},
		{"GET", "/v1/federation/changes", nil},
		{"PUT", "/blobs/{ref}", nil},
		{"POST", "/blobs/batch", nil},
		{"GET", "/blobs/{ref}", nil},
		{"POST", CrossCheckPath, []identity.Role{identity.Aggregator}},
		{"POST", CrossCheckMaskedPath, []identity.Role{identity.Aggregator}},
	}
}

// CrossCheckPath is where an aggregator node recomputes a training round
// for its leader (the cross-checked reduction, aggregator/crosscheck.go):
// served by the aggregator beside the control plane, to other
// aggregators only.
const CrossCheckPath = "/rounds/cross-check"

// CrossCheckMaskedPath is where that node takes the round's masked inputs
// as the leader's host accepts them, to sum them itself.
const CrossCheckMaskedPath = "/rounds/cross-check/masked"

// routes maps each control-plane endpoint to its handler; reads of the
// local replica go through read (refused when the node is cut off).
func (s *Server) routes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"POST /v1/jobs":                 s.submit,
		"GET /v1/jobs":                  s.read(s.listJobs),
		"GET /v1/jobs/{id}":             s.read(s.jobStatus),
		"GET /v1/jobs/{id}/events":      s.read(s.jobEvents),
		"POST /v1/jobs/{id}/cancel":     s.cancelJob,
		"POST /v1/runs":                 s.startRun,
		"GET /v1/runs":                  s.read(s.listRuns),
		"GET /v1/runs/{id}":             s.read(s.runStatus),
		"GET /v1/runs/{id}/model":       s.read(s.runModel),
		"POST /v1/runs/{id}/cancel":     s.cancelRun,
		"POST /v1/runs/{id}/resume":     s.resumeRun,
		"POST /v1/lease":                s.read(s.lease),
		"POST /v1/renew":                s.renew,
		"POST /v1/release":              s.release,
		"POST /v1/commits":              s.commit,
		"POST /v1/results":              s.report,
		"POST /v1/commits/batch":        s.commitBatch,
		"POST /v1/results/batch":        s.reportBatch,
		"POST /v1/renew/batch":          s.renewBatch,
		"POST /v1/reduced":              s.reduced,
		"POST /v1/forward":              s.forward,
		"GET /v1/receipts":              s.read(s.receipts),
		"GET /v1/contributions":         s.read(s.contributions),
		"GET /v1/peers":                 s.read(s.peers),
		"POST /v1/peers/{name}/readmit": s.readmit,
		"GET /v1/status":                s.status,
		"POST /v1/cluster/join":         s.membership(true),
		"POST /v1/cluster/leave":        s.membership(false),
		"GET /v1/cluster/reach/{name}":  s.reach,
		"POST /v1/federation/changes":   s.changeMembership,
		"GET /v1/federation/changes":    s.read(s.changes),
	}
}

// Handler returns the control-plane routes (every Endpoint under /v1/).
// Mount it behind a TLS listener whose config requires and pins client
// certificates.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	hs := s.routes()
	for _, e := range Endpoints() {
		if !strings.HasPrefix(e.Path, "/v1/") {
			continue
		}
		h, ok := hs[e.String()]
		if !ok {
			panic("api: endpoint without a handler: " + e.String())
		}
		mux.HandleFunc(e.String(), s.auth(h, e))
	}
	return mux
}
