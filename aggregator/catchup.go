package aggregator

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/consensus"
)

// A node answers reads from its own replica (api.Server.read), so it must
// not answer before its replica holds what the cluster had committed. A
// node that starts (or regains the leader after being cut off) hears the
// leader's heartbeat before it has replayed its log or received what was
// committed while it was down: Raft's heartbeats carry no log, so "heard
// from the leader lately" held while `job ls` on a restarted node listed
// none of a pool's twelve jobs for half a second, and `fl launch
// --warm-start RUN` right after a cluster started said SC9302 for a run
// `fl ls` listed a moment later.
//
// So a node counts as caught up only once it has done what Raft's
// ReadIndex does (Ongaro's thesis, §6.4), once per contact: a leader
// commits a barrier in its term (every entry of earlier terms is then
// applied here); a follower asks the leader for its commit index and
// waits until its own state machine has applied through it. Until then
// its reads are refused as stale (SC7107) and clients ask another node.

// catchUp is a node's read readiness.
type catchUp struct {
	// leaderTerm is the term in which this node, as leader, applied a
	// barrier (0: none); follower is set once, as a follower, it applied
	// the leader's commit index, and cleared when it loses the leader.
	leaderTerm atomic.Uint64
	follower   atomic.Bool
	// kick wakes the loop at once when a read finds the node behind,
	// so a new leader's barrier does not wait for the next poll.
	kick chan struct{}
}

// catchUpPoll is how often the catch-up loop looks: it bounds how long
// a caught-up node still refuses reads.
const catchUpPoll = 20 * time.Millisecond

// caughtUp reports whether this node's replica may answer reads.
func (n *Node) caughtUp() bool {
	ok := n.ready.follower.Load()
	if role, term := n.raft.Role(); role == consensus.StateLeader {
		ok = n.ready.leaderTerm.Load() == term
	}
	if !ok {
		select {
		case n.ready.kick <- struct{}{}:
		default:
		}
	}
	return ok
}

// catchUpLoop keeps n.ready until ctx ends.
func (n *Node) catchUpLoop(ctx context.Context) {
	t := time.NewTicker(catchUpPoll)
	defer t.Stop()
	var target uint64   // a follower's read index, once the leader named one
	var asked time.Time // when it last asked the leader (its status encodes the whole state hash)
	for {
		role, term := n.raft.Role()
		switch {
		case !n.raft.Fresh():
			n.ready.follower.Store(false)
			target = 0
		case role == consensus.StateLeader:
			if n.ready.leaderTerm.Load() != term {
				bctx, cancel := context.WithTimeout(ctx, n.raft.StaleAfter())
				if n.raft.Barrier(bctx) == nil {
					n.ready.leaderTerm.Store(term)
				}
				cancel()
			}
		case !n.ready.follower.Load():
			if target == 0 && time.Since(asked) >= 10*catchUpPoll {
				asked = time.Now()
				target = n.leaderCommit(ctx)
			}
			if target > 0 && n.raft.AppliedThrough(target) {
				n.ready.follower.Store(true)
				target = 0
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.ready.kick:
		}
	}
}

// leaderCommit asks the leader for its commit index; 0 when it does not
// answer, or has not caught up in its own term yet (its commit index may
// then lag what an earlier leader committed).
func (n *Node) leaderCommit(ctx context.Context) uint64 {
	_, url, self := n.leader()
	if self || url == "" {
		return 0
	}
	qctx, cancel := context.WithTimeout(ctx, n.raft.StaleAfter())
	defer cancel()
	raw, err := n.peerClient.StatusOf(qctx, url)
	if err != nil {
		return 0
	}
	var st NodeStatus
	if json.Unmarshal(raw, &st) != nil || st.Raft.State != consensus.StateLeader || !st.CaughtUp {
		return 0
	}
	return st.Raft.CommitIndex
}
