package consensus

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/scellis/scellis/diag"
)

// TestUnknownCertificateRefused starts an impostor: a node that claims the
// member name n4 with a key the federation does not pin for it. It cannot
// join, its connections are refused, and even forced into the configuration
// it receives nothing and decides nothing.
func TestUnknownCertificateRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, nil)
	leader := c.waitLeader()
	var ref chain
	c.applyN(leader, "members", 3, &ref)

	// The federation pins n4's real key; the impostor holds another one.
	c.pins.pin("n4", newTestKey(t, "n4"))
	impKey := newTestKey(t, "n4")
	impPins := newPins() // the impostor trusts the members' keys
	for id, k := range c.keys {
		impPins.pin(id, k)
	}
	impPins.pin("n4", impKey)
	ln := listen(t, "127.0.0.1:0")
	impAddr := ln.Addr().String()
	impSM := &chainSM{}
	imp, err := Open(Config{
		NodeID:    "n4",
		Listener:  ln,
		Dir:       filepath.Join(t.TempDir(), "impostor"),
		ServerTLS: impPins.serverTLS(impKey),
		ClientTLS: impPins.clientTLS(impKey),
	}, impSM)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()

	// The leader refuses to add it: its certificate is not n4's.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.nodes[leader].AddVoter(ctx, "n4", impAddr)
	if !errors.Is(err, ErrPeerRefused) {
		t.Fatalf("AddVoter(impostor) = %v, want ErrPeerRefused", err)
	}
	if l, ok := diag.As(err); !ok || l[0].Code != diag.ConsensusRefused {
		t.Errorf("AddVoter(impostor) error carries no SC8004 diagnostic: %v", err)
	}
	if st := c.nodes[leader].Status(); len(st.Servers) != 3 {
		t.Fatalf("impostor entered the configuration: %+v", st.Servers)
	}

	// Its own connections to a member are refused at the handshake.
	before := c.pins.rejected.Load()
	conn, err := tls.Dial("tcp", c.addrs[leader], hardenTLS(impPins.clientTLS(impKey)(leader)))
	if err == nil {
		// TLS 1.3: the client finishes before the server has judged its
		// certificate; the server's verdict arrives as an alert.
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("impostor's connection to %s was not refused: %v", leader, err)
	}
	if c.pins.rejected.Load() == before {
		t.Error("no member rejected the impostor's certificate")
	}

	// Forced into the configuration behind AddVoter's back, it still gets no
	// entry and no vote: every connection between it and the members fails.
	before = c.pins.rejected.Load()
	if err := c.nodes[leader].raft.AddVoter("n4", raft.ServerAddress(impAddr), 0, 0).Error(); err != nil {
		t.Fatal(err)
	}
	c.applyN(leader, "with impostor listed", 3, &ref) // 3 of 4 voters still commit
	c.waitConverged(c.live(), ref)
	waitFor(t, 10*time.Second, func() bool { return c.pins.rejected.Load() > before },
		"the leader to refuse the impostor's certificate")
	if n, _ := impSM.state(); n != 0 {
		t.Errorf("impostor applied %d commands", n)
	}
	if st := imp.Status(); st.CommitIndex != 0 || st.Leader.ID != "" || len(st.Servers) != 0 {
		t.Errorf("impostor learned something from the cluster: %+v", st)
	}
}

// TestDialUnknownAddress: the stream layer never dials an address that no
// server of the configuration has, since it could not pin a key for it.
func TestDialUnknownAddress(t *testing.T) {
	c := newCluster(t, 1, nil)
	if _, err := c.nodes["n1"].stream.Dial("127.0.0.1:1", time.Second); err == nil {
		t.Fatal("dialled an address outside the configuration")
	}
}
