package aggregator

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/consensus"
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
// whether they can open one to it (api.ReachResponse; each opens a
// mutually authenticated TLS connection to this node's API address and
// closes it). When at least a quorum of the voters other than this node
// answer and none reached it, those nodes can elect a leader among
// themselves that the silos can reach: this one hands leadership over
// (Raft leadership transfer), and until then it counts no round failure
// that silos' absence caused (runs.go, retryAttempt) — it caused them. A
// follower that cannot reach anyone says nothing useful alone; it takes a
// quorum of them, and a single answer that reached this node, to decide.

// ingress is the leader's latest finding about its own reachability.
type ingress struct {
	mu     sync.Mutex // held through a probe: callers share one
	at     time.Time  // when the finding was made (zero: never)
	cutOff bool
	detail string
}

// reachTimeout is how long a follower gets to reach this node: long
// enough for a TLS handshake with a busy process (a slow node is not a
// cut-off one), short against the silos' lease; 2 to 10 s.
func (n *Node) reachTimeout() time.Duration {
	return min(max(2*time.Second, n.siloLease()/2), 10*time.Second)
}

// ingressEvery is how often a leader probes its reachability: twice per
// silo lease, so it hands over about when the silos' leases lapse here.
func (n *Node) ingressEvery() time.Duration { return n.siloLease() / 2 }

// reach implements api.Server.Reach: open a TLS connection, as this node,
// to aggregator name's API address, and close it.
func (n *Node) reach(ctx context.Context, name string) error {
	m, ok := n.fed.Member(name)
	if !ok || m.Role != identity.Aggregator || m.Address == "" {
		return diag.New(diag.PoolBadRequest, "cluster", "%q is not an aggregator of federation %q", name, n.fed.Name).
			WithHelp("name an aggregator of the federation file")
	}
	cfg, err := identity.ClientTLSConfig(n.id, n.fed, name, identity.Aggregator)
	if err != nil {
		return err
	}
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", m.Address)
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
	n.ingress.mu.Lock()
	defer n.ingress.mu.Unlock()
	tenure := time.Unix(0, n.leaderSince.Load())
	if time.Since(n.ingress.at) > n.ingressEvery() || n.ingress.at.Before(tenure) {
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cut, detail := n.unheard(ctx)
		if !cut || ctx.Err() != nil {
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
