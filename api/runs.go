package api

import (
	"context"
	"net/http"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
)

// Managing a run: cancel (stop it for good) and resume (continue a paused
// run from its last completed round). Either is its submitter's (the
// member who launched it) or an operator's to do; the state machine
// decides (coordinator.mayCancel), the server stamps who asks.

// RunActionRequest says why a run is cancelled (resume takes no reason).
type RunActionRequest struct {
	Reason string `json:"reason,omitempty"`
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	var req RunActionRequest
	if !decode(w, r, &req) {
		return
	}
	p := peerOf(r)
	reason := "cancelled by " + p.Name
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	s.apply(w, r, coordinator.StopRun{Run: id, Reason: reason, Peer: p.Name, Operator: p.Role == identity.Operator, Now: s.now()})
}

func (s *Server) resumeRun(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	var req RunActionRequest
	if !decode(w, r, &req) {
		return
	}
	p := peerOf(r)
	s.apply(w, r, coordinator.ResumeRun{Run: id, Peer: p.Name, Operator: p.Role == identity.Operator, Now: s.now()})
}

// CancelRun stops a running or paused run (owner or operator only).
func (c *Client) CancelRun(ctx context.Context, id content.Ref, reason string) (coordinator.StopRunResponse, error) {
	var out coordinator.StopRunResponse
	err := c.do(ctx, "POST", "/v1/runs/"+string(id)+"/cancel", RunActionRequest{Reason: reason}, &out)
	return out, err
}

// ResumeRun continues a paused run (owner or operator only).
func (c *Client) ResumeRun(ctx context.Context, id content.Ref) (coordinator.StopRunResponse, error) {
	var out coordinator.StopRunResponse
	err := c.do(ctx, "POST", "/v1/runs/"+string(id)+"/resume", RunActionRequest{}, &out)
	return out, err
}

// maxLeaseWait bounds how long a lease request may be held.
const maxLeaseWait = 30 * time.Second

// holdLease holds an empty lease request until a shard of kinds may be
// leasable for peer (an event was applied and Leasable says so), wait
// passes, or the client goes away. It reports whether the client is still
// there.
func (s *Server) holdLease(r *http.Request, peer string, kinds coordinator.Kinds, wait time.Duration) bool {
	events, cancel := s.Events.Subscribe("")
	defer cancel()
	t := time.NewTimer(min(wait, maxLeaseWait))
	defer t.Stop()
	for {
		select {
		case <-r.Context().Done():
			return false
		case <-t.C:
			return true
		case _, ok := <-events:
			if !ok {
				return true // dropped for falling behind: let the client ask again
			}
			if s.Read.Leasable(peer, kinds, s.now()) > 0 {
				return true
			}
		}
	}
}
