package aggregator

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// Silo liveness. A silo polls the leader for leases all the time (a long
// poll, api.LeaseRequest.WaitMS), so its polls are its heartbeat: a silo
// is alive while its last poll is younger than Options.SiloLease. A silo
// whose held poll ends because its connection closed (the process died) is
// gone at once. The record is the leader's, in memory: liveness is a
// leader's planning input, not replicated state (law 10: it enters the log
// only as the cohort of a round job). A new leader knows nobody yet, and
// gives every silo one lease from the start of its tenure to poll.
//
// A child cluster (docs/tree.md) beats the same way: each of its nodes
// holds a heartbeat toward this one (api.LeaseRequest.Heartbeat), so the
// child is alive while one is held here, or was answered within the
// lease; it is gone at once when the last held one's connection closes
// (every node died), and otherwise a lease after its last beat (cut
// off, or without a leader of its own: its nodes beat only while they
// hear from one). Its leader dying ends only that node's heartbeat. A
// silo that a child leads is the child's to judge: here it is alive
// while its child is (runRound).

func (n *Node) siloLease() time.Duration {
	if n.opt.SiloLease > 0 {
		return n.opt.SiloLease
	}
	return 6 * time.Second
}

// sawPeer records a poll (api.Server.Seen).
func (n *Node) sawPeer(peer string) { n.seen.Store(peer, time.Now()) }

// lostPeer records a peer whose held poll ended with its connection
// (api.Server.Gone), and wakes whoever waits on a lapse. A peer that
// still holds another heartbeat here (another node of a child cluster)
// or another lease poll (a silo's other lane) is not lost.
func (n *Node) lostPeer(peer string) {
	if n.beating(peer) || (n.api != nil && n.api.Held(peer) > 0) {
		return
	}
	n.seen.Store(peer, time.Time{})
	n.peerGone.fire()
}

// beating reports whether peer holds a heartbeat here now.
func (n *Node) beating(peer string) bool { return n.api != nil && n.api.Beating(peer) > 0 }

// signal is a broadcast condition: wait returns a channel closed by the
// next fire. The zero value is ready.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// tenureGrace is how long a new leader waits for silos it has not heard
// from before it counts them out: two leases, since a silo's client may
// first spend an attempt on the old leader (stopped, or cut off) before it
// finds this one.
func (n *Node) tenureGrace() time.Duration { return 2 * n.siloLease() }

// newTenure reports whether this node has led for less than tenureGrace.
func (n *Node) newTenure() bool {
	return time.Since(time.Unix(0, n.leaderSince.Load())) < n.tenureGrace()
}

// polling lists the peers this node, as leader, counts alive now, sorted
// (NodeStatus.Polling): what a round planned now would count on.
func (n *Node) polling() []string {
	if n.raft.Status().State != consensus.StateLeader {
		return nil
	}
	var out []string
	n.seen.Range(func(k, _ any) bool {
		if p := k.(string); n.alive(p) {
			out = append(out, p)
		}
		return true
	})
	slices.Sort(out)
	return out
}

// alive reports whether silo polled within the lease.
func (n *Node) alive(silo string) bool { return n.lapsesIn(silo) >= 0 }

// lapsesIn returns how long until silo's lease lapses (negative once it
// has; a silo whose held poll ended with its connection has lapsed).
func (n *Node) lapsesIn(silo string) time.Duration {
	if n.beating(silo) {
		return n.siloLease() // its held heartbeat is answered within the lease
	}
	if v, ok := n.seen.Load(silo); ok {
		t := v.(time.Time)
		if t.IsZero() {
			return -1
		}
		return n.siloLease() - time.Since(t)
	}
	return n.siloLease() - time.Since(time.Unix(0, n.leaderSince.Load()))
}

// excuseLapsed excuses, from the round's secure aggregation, every member
// whose lease lapses while the round runs: the current phase stops waiting
// for it and ends with the others (at once if they have all answered),
// instead of at the phase deadline. The join deadline stays the backstop.
// It sleeps until the earliest moment a member's lease can lapse (a poll
// in between only moves that moment later, which the next check sees), or
// until a member's held poll ends with its connection: no fixed tick.
func (n *Node) excuseLapsed(ctx context.Context, round string, members []secagg.Member) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	excused := map[string]bool{}
	for {
		gone := n.peerGone.wait()
		next := time.Duration(-1)
		for _, m := range members {
			if excused[m.ID] {
				continue
			}
			d := n.lapsesIn(m.ID)
			if d < 0 {
				excused[m.ID] = true
				n.log.Info("silo lease lapsed: left out of the round", "silo", m.ID, "round", round)
				n.excuse(round, m.ID)
				continue
			}
			if next < 0 || d < next {
				next = d
			}
		}
		if next < 0 {
			next = time.Hour // everyone excused: wait for the round's end
		}
		if !waitLapse(ctx, timer, next, gone) {
			return
		}
	}
}

// waitLapse waits until d has passed (a lapse due then: a millisecond
// more, to be past it) or a held poll ended with its connection (gone);
// false once ctx ends. timer is the caller's, reused.
func waitLapse(ctx context.Context, timer *time.Timer, d time.Duration, gone <-chan struct{}) bool {
	timer.Reset(d + time.Millisecond)
	select {
	case <-ctx.Done():
		return false
	case <-gone:
	case <-timer.C:
	}
	return true
}

// revokeGone re-delegates a gone child cluster's pooled work at once
// (docs/tree.md, "Failures"): while this node leads, each time a child
// cluster (a member with role cluster) is gone by its heartbeat — the
// last held one's connection closed, or none beat within the silo lease
// — its live leases on undecided shards of pooled jobs (not a run's
// round jobs: a round's child is judged by watchChildren and its retry)
// are ended through the log, with the ReleaseLeases a peer would send,
// so the shards are leased again at once, to another child or to this
// cluster's own workers, instead of after the job's lease TTL. It is
// liveness, never a timer: a child that beats keeps its leases however
// slow it is. A child that comes back and reports shards it finished is
// a late reporter, as after an expiry. In a new tenure a child not heard
// from yet is given tenureGrace to find this leader, as silos are.
func (n *Node) revokeGone(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		gone := n.peerGone.wait()
		next := time.Hour
		for _, c := range n.fed.ByRole(identity.Cluster) {
			d := n.lapsesIn(c.Name)
			if _, heard := n.seen.Load(c.Name); !heard && n.newTenure() {
				d = n.tenureGrace() - time.Since(time.Unix(0, n.leaderSince.Load()))
			}
			if d >= 0 {
				next = min(next, d)
				continue
			}
			if !n.revokePooled(ctx, c.Name) {
				next = min(next, time.Second) // try again: the leases still wait
			}
		}
		if !waitLapse(ctx, timer, next, gone) {
			return
		}
	}
}

// revokePooled ends child's live leases on pooled jobs' shards; false
// when they may still be live (the proposal failed).
func (n *Node) revokePooled(ctx context.Context, child string) bool {
	m := n.fsm.machine()
	rounds := map[content.Ref]bool{}
	for _, js := range m.JobsIn(coordinator.JobRunning) {
		if js.Run != "" {
			rounds[js.ID] = true
		}
	}
	var shards []coordinator.ShardRef
	for _, l := range m.Leases(child) {
		if !rounds[l.Job] {
			shards = append(shards, coordinator.ShardRef{Job: l.Job, Shard: l.Shard})
		}
	}
	if len(shards) == 0 {
		return true
	}
	res, err := n.Apply(ctx, coordinator.ReleaseLeases{Peer: child, Now: time.Now().UnixMilli(), Shards: shards})
	switch {
	case err != nil:
		n.log.Debug("revoking a gone child's leases", "child", child, "err", err)
		return false
	case len(res.Refusal) > 0:
		n.log.Warn("revoking a gone child's leases refused", "child", child, "err", res.Refusal)
		return false
	}
	n.log.Warn("child cluster gone: its leases on pooled shards revoked, to be leased again at once", "child", child, "leases", len(shards))
	return true
}
