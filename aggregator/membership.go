package aggregator

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Membership through the log, on an aggregator node. Each change the
// node's state machine applies (and each snapshot it restores) replaces
// the effective membership of n.fed, which every TLS config of the node
// reads at each handshake: API, blob and secure-aggregation listeners, the
// Raft transport and this node's own dials. Then the node closes the API
// connections of keys that are no longer members (revoked, or rotated
// away), and, if its own key was rotated, picks up its new key.

// conns tracks the API server's connections and the key each
// authenticated with, to close a revoked member's. The key is recorded when
// the connection serves its first request (its handshake is complete
// then), so closing never touches a connection's TLS state, and a
// handshake in progress — checked against the new membership when it
// completes — cannot stall it.
type conns struct {
	mu sync.Mutex
	m  map[net.Conn]identity.PublicKey // zero key: not yet known
}

func (c *conns) track(fed *identity.Federation) func(net.Conn, http.ConnState) {
	return func(conn net.Conn, st http.ConnState) {
		var key identity.PublicKey
		if st == http.StateActive {
			if tc, ok := conn.(*tls.Conn); ok {
				cs := tc.ConnectionState()
				m, ok := fed.Peer(&cs)
				if !ok {
					// Its key was revoked (or rotated away) after the
					// handshake, before this request: it serves nothing
					// more, and the member's next handshake is refused.
					conn.Close()
					return
				}
				key = m.PublicKey
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m == nil {
			c.m = map[net.Conn]identity.PublicKey{}
		}
		switch st {
		case http.StateNew:
			c.m[conn] = identity.PublicKey{}
		case http.StateActive:
			if _, tracked := c.m[conn]; tracked && key != (identity.PublicKey{}) {
				c.m[conn] = key
			}
		case http.StateClosed, http.StateHijacked:
			delete(c.m, conn)
		}
	}
}

// closeNonMembers closes every connection whose key fed no longer lists
// (in the background: closing may wait on a slow peer) and returns how
// many.
func (c *conns) closeNonMembers(fed *identity.Federation) int {
	c.mu.Lock()
	var drop []net.Conn
	for conn, key := range c.m {
		if key == (identity.PublicKey{}) {
			continue
		}
		if _, ok := fed.Lookup(key); !ok {
			drop = append(drop, conn)
			delete(c.m, conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range drop {
		go conn.Close()
	}
	return len(drop)
}

// membershipApplied follows the replicated membership after a change or a
// restore. It runs on the state machine's goroutine.
func (n *Node) membershipApplied(m *coordinator.Machine) {
	members, changes, seeded := m.Membership()
	if !seeded {
		return
	}
	n.fed.SetMembers(api.Members(members), len(changes))
	if closed := n.conns.closeNonMembers(n.fed); closed > 0 {
		n.log.Info("closed the connections of revoked members", "connections", closed)
	}
	// Loading a key file may take a second (an encrypted one): not on
	// the state machine's goroutine.
	go n.followOwnKey()
}

// followOwnKey, when the membership lists a new key for this node, loads
// the node's identity file again (Options.ReloadIdentity) and switches to
// it if it holds that key. Until it does, the others refuse this node's
// new connections: the operator puts the new key in place first, then
// rotates (docs/identity.md).
func (n *Node) followOwnKey() {
	n.rekey.Lock()
	defer n.rekey.Unlock()
	self, ok := n.fed.Member(n.Self.Name)
	if !ok || self.PublicKey.Equal(n.id.Public()) {
		return
	}
	if n.opt.ReloadIdentity == nil {
		n.log.Error("this node's key was rotated, and it cannot load a new one", "node", n.Self.Name)
		return
	}
	next, err := n.opt.ReloadIdentity()
	if err == nil && !next.Public().Equal(self.PublicKey) {
		err = diag.New(diag.NotAMember, n.Self.Name, "the identity file holds %s, but the federation now lists %s for %s", next.Public(), self.PublicKey, n.Self.Name).
			WithHelp("put the new key (the one given to scellis federation rotate) at the identity path, then send the aggregator SIGHUP")
	}
	if err != nil {
		n.log.Error("key rotation", "err", err)
		return
	}
	n.id.Replace(next)
	n.log.Info("key rotated: new connections use the new key", "key", next.Public().String())
}

// ReloadIdentity re-reads the node's identity file now (SIGHUP): the way
// to pick up a rotated key that was put in place after the rotation.
func (n *Node) ReloadIdentity() {
	// Loading a key file may take a second (an encrypted one): not on
	// the state machine's goroutine.
	go n.followOwnKey()
}

// changes serves the signed membership changes to the API.
func (n *Node) changes() [][]byte {
	_, changes, _ := n.fsm.machine().Membership()
	return changes
}

// voters names the Raft voters this node knows.
func (n *Node) voters() []string {
	var out []string
	for _, s := range n.raft.Status().Servers {
		out = append(out, s.ID)
	}
	return out
}
