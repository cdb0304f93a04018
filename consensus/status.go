package consensus

import (
	"strconv"
	"time"

	"github.com/hashicorp/raft"
)

// State is a node's Raft role.
type State string

const (
	StateFollower  State = "follower"
	StateCandidate State = "candidate"
	StateLeader    State = "leader"
	StateShutdown  State = "shutdown"
)

func stateOf(s raft.RaftState) State {
	switch s {
	case raft.Leader:
		return StateLeader
	case raft.Candidate:
		return StateCandidate
	case raft.Follower:
		return StateFollower
	default:
		return StateShutdown
	}
}

// Status is a node's view of the cluster, for `scellis aggregator status`.
type Status struct {
	ID    string
	State State
	Term  uint64
	// CommitIndex is the last log index this node knows committed.
	CommitIndex uint64
	// AppliedIndex is the last log index handed to the state machine (the
	// machine may still be applying it).
	AppliedIndex uint64
	// LastSnapshotIndex is the log index of this node's latest snapshot, 0 if
	// it has none.
	LastSnapshotIndex uint64
	// Leader is the leader this node knows of; empty fields when none.
	Leader Server
	// LeaderContactMs is how long ago this node last heard from the
	// leader, in milliseconds: 0 on the leader itself, -1 when no leader
	// is known or it was never heard from.
	LeaderContactMs int64
	// Fresh says whether this node's reads can be trusted to be recent:
	// it is the leader, or a follower that heard from the leader within
	// two heartbeat timeouts. A node cut off from the cluster is not.
	Fresh bool
	// Servers is the latest configuration this node knows (possibly not yet
	// committed), in configuration order.
	Servers []Server
}

// Status returns the node's current view. It does not block on the cluster.
func (n *Node) Status() Status {
	r := n.raft
	st := Status{
		ID:           n.cfg.NodeID,
		State:        stateOf(r.State()),
		Term:         r.CurrentTerm(),
		CommitIndex:  r.CommitIndex(),
		AppliedIndex: r.AppliedIndex(),
	}
	if v, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64); err == nil {
		st.LastSnapshotIndex = v
	}
	st.Leader.ID, st.Leader.Address = n.Leader()
	st.Servers = n.servers()
	age, ok := n.LeaderContact()
	st.LeaderContactMs = -1
	if ok {
		st.LeaderContactMs = age.Milliseconds()
	}
	st.Fresh = ok && age <= n.StaleAfter()
	return st
}

// LeaderContact returns how long ago this node last heard from the leader
// (0 on the leader), and false when it knows no leader.
func (n *Node) LeaderContact() (time.Duration, bool) {
	switch n.raft.State() {
	case raft.Leader:
		return 0, true
	case raft.Follower:
		if id, _ := n.Leader(); id == "" {
			return 0, false
		}
		last := n.raft.LastContact()
		if last.IsZero() {
			return 0, false
		}
		return time.Since(last), true
	default:
		return 0, false
	}
}

// Role returns this node's Raft role and current term, without the
// configuration and statistics Status gathers.
func (n *Node) Role() (State, uint64) { return stateOf(n.raft.State()), n.raft.CurrentTerm() }

// StaleAfter is how long a follower may go without hearing from the leader
// before its reads count as stale: two heartbeat timeouts (a healthy
// leader contacts it every tenth of one).
func (n *Node) StaleAfter() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// AppliedIndex is the last log index handed to the state machine.
func (n *Node) AppliedIndex() uint64 { return n.raft.AppliedIndex() }

// AppliedThrough reports whether the state machine has applied every
// command committed at or before index, so that reads from it see them.
// Raft hands committed entries to the machine on its own goroutine
// (AppliedIndex counts what was handed, not what was applied), and
// entries that are no commands (Raft's no-ops, configuration changes)
// never reach it; entries at or below the latest snapshot are in the
// machine's state, restored or taken from it.
func (n *Node) AppliedThrough(index uint64) bool {
	if n.raft.AppliedIndex() < index {
		return false
	}
	from := n.fsm.applied.Load()
	if from >= index {
		return true
	}
	if v, err := strconv.ParseUint(n.raft.Stats()["last_snapshot_index"], 10, 64); err == nil && v > from {
		from = v
	}
	for i := index; i > from; i-- {
		var l raft.Log
		if err := n.logs.GetLog(i, &l); err != nil || l.Type == raft.LogCommand {
			return false // a command still queued for the machine (or a gap a newer snapshot will cover)
		}
	}
	return true
}

// Fresh reports whether this node's reads are recent (see Status.Fresh).
func (n *Node) Fresh() bool {
	age, ok := n.LeaderContact()
	return ok && age <= n.StaleAfter()
}

// Leader returns the ID and Raft address of the leader this node knows of,
// or empty strings when none is known.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// servers returns the latest configuration (non-blocking in raft v1.8).
func (n *Node) servers() []Server {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	cfg := f.Configuration()
	out := make([]Server, 0, len(cfg.Servers))
	for _, s := range cfg.Servers {
		out = append(out, Server{ID: string(s.ID), Address: string(s.Address)})
	}
	return out
}
