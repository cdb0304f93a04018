package aggregator

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// A leader nobody can reach. Raft's traffic is the leader's to start: it
// dials its followers and they answer on its connections, so a leader
// whose inbound ports are dropped (an asymmetric partition) keeps its
// followers' heartbeats, its quorum and its leadership. Nobody reaches its
// API: the silos' polls, its only evidence that they are alive, time out,
// and the followers redirect every silo back to it. Each round then found
// too few silos alive, counted as its own failure, and the run paused
// after round_attempts — while the silos were healthy and the other two
// nodes could have led (issue 30: paused in 2 of 2 tries).
//
// So the leader asks its followers, over connections it opens itself,
// whether they can open one to it (api.ReachResponse; each opens a TCP
// connection to this node's API address and closes it). When at least a
// quorum of the voters other than this node answer and none reached it,
// those nodes can elect a leader among themselves that the silos can
// reach: this one hands leadership over (Raft leadership transfer), and
// until then it counts no round failure that silos' absence caused
// (runs.go, retryAttempt) — it caused them. A follower that cannot reach
// anyone says nothing useful alone: it takes a quorum of them, and one
// follower that reached this node keeps it leading.

// ingress is the leader's latest finding about its own reachability.
type ingress struct {
	mu     sync.Mutex // held through a probe: callers share one
	at     time.Time  // when the finding was made (zero: never)
	cutOff bool
	detail string
}

// reachTimeout is how long a follower gets to reach this node: long
// enough for a SYN lost once to be sent again (a lossy link is not a cut
// one), short against the silos' lease; 2 to 10 s.
func (n *Node) reachTimeout() time.Duration {
	return min(max(2*time.Second, n.siloLease()/2), 10*time.Second)
}

// ingressEvery is how often a leader probes its reachability: twice per
// silo lease, so it hands over about when the silos' leases lapse here.
func (n *Node) ingressEvery() time.Duration { return n.siloLease() / 2 }

// reach implements api.Server.Reach: open a TCP connection to aggregator
// name's API address, and close it. TCP, not TLS: the kernel completes the
// handshake for a process however busy, so a loaded leader does not look
// cut off, while a dropped port never answers.
func (n *Node) reach(ctx context.Context, name string) error {
	m, ok := n.fed.Member(name)
	if !ok || m.Role != identity.Aggregator || m.Address == "" {
		return diag.New(diag.PoolBadRequest, "cluster", "%q is not an aggregator of federation %q", name, n.fed.Name).
			WithHelp("name an aggregator of the federation file")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", m.Address)
	if err != nil {
		return err
	}
	return conn.Close()
}

// probeIngress asks every other voter, at once, whether it can reach this
// node. cutOff: at least a quorum of the voters answered, none reached it.
func (n *Node) probeIngress(ctx context.Context) (cutOff bool, detail string) {
	voters := n.voters()
	others := slices.DeleteFunc(slices.Clone(voters), func(v string) bool { return v == n.Self.Name })
	if n.peerClient == nil || len(others) == 0 {
		return false, "no other voter"
	}
	type answer struct {
		node, note string
		reached    bool
		answered   bool
	}
	answers := make(chan answer, len(others))
	for _, v := range others {
		go func() {
			m, ok := n.fed.Member(v)
			if !ok {
				answers <- answer{node: v, note: "not in the federation file"}
				return
			}
			r, err := n.peerClient.ReachFrom(ctx, "https://"+m.Address, n.Self.Name, n.reachTimeout())
			switch {
			case err != nil:
				answers <- answer{node: v, note: "did not answer: " + err.Error()}
			case r.Reached:
				answers <- answer{node: v, reached: true, answered: true, note: fmt.Sprintf("reached it in %d ms", r.Millis)}
			default:
				answers <- answer{node: v, answered: true, note: "cannot reach it: " + r.Error}
			}
		}()
	}
	var unreached, reached int
	var notes []string
	for range others {
		a := <-answers
		notes = append(notes, a.node+" "+a.note)
		switch {
		case a.reached:
			reached++
		case a.answered:
			unreached++
		}
	}
	slices.Sort(notes)
	return reached == 0 && unreached >= len(voters)/2+1, strings.Join(notes, "; ")
}

// unheard reports whether the other aggregators cannot reach this leader,
// by a finding of this tenure younger than ingressEvery, else by a fresh
// probe (callers at the same time share it).
func (n *Node) unheard(ctx context.Context) (bool, string) {
	return n.findIngress(ctx, false)
}

// findIngress returns the latest finding, probing first when fresh is set
// or the finding is older than ingressEvery or than this tenure.
func (n *Node) findIngress(ctx context.Context, fresh bool) (bool, string) {
	n.ingress.mu.Lock()
	defer n.ingress.mu.Unlock()
	tenure := time.Unix(0, n.leaderSince.Load())
	if fresh || time.Since(n.ingress.at) > n.ingressEvery() || n.ingress.at.Before(tenure) {
		n.ingress.cutOff, n.ingress.detail = n.probeIngress(ctx)
		n.ingress.at = time.Now()
	}
	return n.ingress.cutOff, n.ingress.detail
}

// watchIngress runs while this node leads: every ingressEvery it checks
// that the other aggregators can reach it, and hands leadership over when
// they cannot. It ends with the tenure (ctx).
func (n *Node) watchIngress(ctx context.Context) {
	t := time.NewTicker(n.ingressEvery())
	defer t.Stop()
	for found := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cut, detail := n.findIngress(ctx, true)
		if found++; !cut {
			found = 0
		}
		// Two findings in a row: a hand-over costs the cluster a round,
		// and one probe can meet a passing fault.
		if found < 2 || ctx.Err() != nil {
			continue
		}
		n.log.Warn("the other aggregators cannot reach this leader's API: handing leadership over", "probes", detail)
		// The transfer's wait for the new leader may end with the tenure
		// instead: a node nobody reaches does not hear who won.
		to, err := n.HandOver(ctx)
		if err != nil && n.raft.Status().State == consensus.StateLeader {
			n.log.Warn("leadership hand-over failed; trying again", "err", err)
			continue
		}
		n.log.Info("leadership handed over", "to", to)
		return
	}
}

// selfInflicted says why a failed attempt of a round (job, if one was
// submitted) that heals is this leader's doing rather than its silos'
// ("" when it is theirs): the other aggregators cannot reach this leader
// (the silos cannot either, and it hands over), or the attempt was planned
// in the first tenureGrace of its tenure, before the silos — each
// spending an attempt on the old leader, possibly one nobody reaches —
// had found it. The latter only delays counting: attempts planned after
// the grace count.
func (n *Node) selfInflicted(ctx context.Context, job content.Ref, heals bool) string {
	if !heals {
		return ""
	}
	if cut, detail := n.unheard(ctx); cut {
		return "the other aggregators cannot reach this leader (" + detail + ")"
	}
	if job == "" {
		return "" // too few alive: runRound waits out a new tenure itself
	}
	js, err := n.fsm.machine().Job(job)
	grace := time.Unix(0, n.leaderSince.Load()).Add(n.tenureGrace())
	if err == nil && time.UnixMilli(js.SubmittedAt).Before(grace) {
		return "planned before the silos had found this new leader"
	}
	return ""
}
