package consensus

import (
	"errors"
	"fmt"
)

// Errors returned by a Node. Match them with errors.Is; the errors actually
// returned often wrap them with more detail.
var (
	// ErrNotLeader is returned by writes (Apply, Barrier, AddVoter,
	// RemoveServer) on a node that is not the leader. The returned error is a
	// *NotLeaderError that names the leader when one is known, so an API
	// server can redirect its client.
	ErrNotLeader = errors.New("consensus: not the leader")

	// ErrOutcomeUnknown is returned when a command was handed to Raft but the
	// node cannot tell whether it committed: leadership was lost while it was
	// in flight, or the caller's context ended first. The command may still
	// be applied on every node, so callers retry only idempotent commands
	// (the state machine must recognise a resubmission).
	ErrOutcomeUnknown = errors.New("consensus: outcome unknown, the command may or may not commit")

	// ErrClosed is returned by every method after Close, and to callers whose
	// commands were still queued when the node closed (those were never
	// handed to Raft).
	ErrClosed = errors.New("consensus: node closed")

	// ErrPeerRefused is returned by AddVoter when the new server's TLS
	// certificate is refused by ClientTLS (an unknown or impostor key), so it
	// is never added to the configuration.
	ErrPeerRefused = errors.New("consensus: peer refused at the TLS handshake")
)

// NotLeaderError is the error behind ErrNotLeader. LeaderID and LeaderAddr
// are empty when no leader is known (an election is under way, or this node
// is cut off). LeaderAddr is the leader's Raft address; an API server maps
// LeaderID to the leader's API address through the federation file.
type NotLeaderError struct {
	LeaderID   string
	LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "consensus: not the leader, and no leader is known"
	}
	return fmt.Sprintf("consensus: not the leader; the leader is %s at %s", e.LeaderID, e.LeaderAddr)
}

// Unwrap makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }
