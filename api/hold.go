package api

import (
	"net/http"
	"sync"

	"github.com/scellis/scellis/diag"
)

// A member's long-lived requests are bounded so that one member (a buggy
// client, a compromised key) cannot pin a node's goroutines, memory and
// event subscriptions with thousands of held connections. The bounds are
// far above what the CLI, a worker or a silo holds: one lease poll per
// process, one event stream per `fl watch` or `pool status --follow`.
const (
	maxLeaseHolds   = 4
	maxEventStreams = 16
	// maxHeartbeats: one per node of a child cluster (3 or 5), with room
	// for restarted nodes whose old connections are not yet seen closed.
	maxHeartbeats = 8
)

// holds counts open long-lived requests per (kind, member). The zero value
// is ready.
type holds struct {
	mu sync.Mutex
	n  map[placeKey]int
}

type placeKey struct{ kind, member string }

// enter takes a place for one of member's requests of kind, or writes the
// refusal (429, SC7109) and reports false when member already holds max.
// The returned func gives the place back.
func (h *holds) enter(w http.ResponseWriter, kind, member string, max int) (func(), bool) {
	k := placeKey{kind, member}
	h.mu.Lock()
	if h.n == nil {
		h.n = map[placeKey]int{}
	}
	if h.n[k] >= max {
		h.mu.Unlock()
		writeDiag(w, http.StatusTooManyRequests, diag.New(diag.PoolBusy, "member "+member, "%q already holds %d open %s requests on this node", member, max, kind).
			WithHelp("each process needs one at a time: close the stale connections, or run fewer watchers per member"))
		return nil, false
	}
	h.n[k]++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.n[k]--; h.n[k] <= 0 {
			delete(h.n, k)
		}
	}, true
}

// Held is how many lease long polls member holds open on this node now.
func (s *Server) Held(member string) int {
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	return s.holds.n[placeKey{"lease", member}]
}

// Beating is how many heartbeats (LeaseRequest.Heartbeat) member holds
// open on this node now: for a child cluster, how many of its nodes beat.
func (s *Server) Beating(member string) int {
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	return s.holds.n[placeKey{"heartbeat", member}]
}
