package api

import (
	"context"
	"net/http"

	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// Forwarding. A browser volunteer works through the node whose page it
// opened (docs/volunteers.md), and only the leader can commit; a
// follower's page forwards the volunteer's commands to the leader through
// POST /v1/forward, as the aggregator it is (mutual TLS). Only the
// commands a volunteer's work is made of, in a volunteer's name, are
// taken: a forwarding node cannot act as a member through this door. The
// state machine checks each command as if the volunteer had sent it to the
// leader — a report still needs the volunteer's own signature (SC7305).

// ForwardRequest carries one coordinator command in its canonical
// encoding (coordinator.EncodeCommand).
type ForwardRequest struct {
	Command []byte `json:"command"`
}

// forwardable reports whether cmd may come through POST /v1/forward.
func forwardable(cmd coordinator.Command) (peer string, ok bool) {
	switch c := cmd.(type) {
	case coordinator.Lease:
		return c.Peer, true
	case coordinator.RenewLease:
		return c.Peer, true
	case coordinator.ReleaseLeases:
		return c.Peer, true
	case coordinator.CommitResult:
		return c.Peer, true
	case coordinator.ReportResult:
		return c.Peer, true
	}
	return "", false
}

// forward serves POST /v1/forward: the outcome of the command, refusals
// included, as an Applied (200); a follower answers 307 to the leader.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	var req ForwardRequest
	if !decode(w, r, &req) {
		return
	}
	cmd, err := coordinator.DecodeCommand(req.Command)
	if err != nil {
		writeDiags(w, http.StatusBadRequest, diagsOf(err))
		return
	}
	if peer, ok := forwardable(cmd); !ok || !receipt.IsVolunteer(peer) {
		writeDiag(w, http.StatusForbidden, diag.New(diag.PoolForbidden, "forward", "only a browser volunteer's lease, renewal, release, commitment or report may be forwarded (got %T for %q)", cmd, peer).
			WithHelp("members send their own commands to the leader"))
		return
	}
	res, err := s.Apply.Apply(r.Context(), cmd)
	if err != nil {
		s.writeApplied(w, r, res, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// Forward has the leader apply a browser volunteer's command (POST
// /v1/forward) and returns its outcome as the leader's Apply would.
func (c *Client) Forward(ctx context.Context, cmd coordinator.Command) (Applied, error) {
	b, err := coordinator.EncodeCommand(cmd)
	if err != nil {
		return Applied{}, err
	}
	var out Applied
	return out, c.do(ctx, "POST", "/v1/forward", ForwardRequest{Command: b}, &out)
}
