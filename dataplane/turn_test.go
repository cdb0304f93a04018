package dataplane

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/pion/turn/v5"
)

// turnClient allocates a relay on srv with a credential issued to member
// (pion/turn's client, as a browser would); the client is closed with t.
func turnClient(t *testing.T, srv *TURN, member string) (*turn.Client, error) {
	t.Helper()
	cred := srv.Credentials(member)[1]
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	c, err := turn.NewClient(&turn.ClientConfig{STUNServerAddr: addr, TURNServerAddr: addr, Conn: conn, Username: cred.Username, Password: cred.Credential, Realm: "scellis"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); conn.Close() })
	if err := c.Listen(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Allocate()
	return c, err
}

// A credential — which any browser volunteer gets from /p2p/browser/ice —
// must not turn the relay into a proxy into the node's own network: a
// permission for loopback, private, link-local (cloud metadata),
// unspecified, multicast, carrier-NAT or NAT64 addresses is refused; a
// public address is granted (the node's own relay address too: a worker
// behind a symmetric NAT reaches this node through it).
// Before the permission hook every one of these was granted.
func TestTURNRefusesNonPublicPeers(t *testing.T) {
	srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(203, 0, 113, 7)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := turnClient(t, srv, "browser/v1")
	if err != nil {
		t.Fatal(err)
	}
	refused := []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0",
		"224.0.0.1", "100.64.0.1", "[::1]", "[fe80::1]", "[fd00::1]", "[64:ff9b::a01:203]", "[::ffff:127.0.0.1]"}
	for _, h := range refused {
		peer, err := net.ResolveUDPAddr("udp", net.JoinHostPort(strings.Trim(h, "[]"), "9"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CreatePermission(peer); err == nil {
			t.Errorf("a relay to %s was permitted", h)
		}
	}
	for _, ip := range []net.IP{net.IPv4(8, 8, 8, 8), net.IPv4(203, 0, 113, 7)} {
		if err := c.CreatePermission(&net.UDPAddr{IP: ip, Port: 53}); err != nil {
			t.Errorf("a relay to public address %s was refused: %v", ip, err)
		}
	}
	// The IPv4 ones reach the hook (the IPv6 ones fail earlier, against
	// an IPv4 relay); each is counted.
	if got := srv.Stats().Denied; got < 9 {
		t.Errorf("refused_peers = %d, want ≥ 9", got)
	}
}

// An operator's allow list (turn_allow_peers) opens exactly its ranges:
// a loopback federation relays on 127.0.0.1, and still not to 10/8.
func TestTURNAllowPeers(t *testing.T) {
	srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1), AllowPeers: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := turnClient(t, srv, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreatePermission(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}); err != nil {
		t.Errorf("an allowed loopback peer was refused: %v", err)
	}
	if err := c.CreatePermission(&net.UDPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9}); err == nil {
		t.Error("a private peer outside the allow list was permitted")
	}
}

// One credential holder cannot take every relay: its fifth allocation is
// refused (486) while another member still gets one. Before, one member
// held all MaxAllocations and the next got 486.
func TestTURNQuotaPerMember(t *testing.T) {
	srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1), MaxAllocations: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for i := range 4 {
		if _, err := turnClient(t, srv, "browser/greedy"); err != nil {
			t.Fatalf("allocation %d of the greedy member: %v", i+1, err)
		}
	}
	if _, err := turnClient(t, srv, "browser/greedy"); err == nil || !strings.Contains(err.Error(), "486") {
		t.Fatalf("a fifth allocation for one member: want 486, got %v", err)
	}
	if _, err := turnClient(t, srv, "browser/other"); err != nil {
		t.Fatalf("another member was refused: %v", err)
	}
	if st := srv.Stats(); st.Refused != 1 || st.Allocations != 5 {
		t.Errorf("stats %+v, want 1 refused and 5 allocations", st)
	}
}

// loopbackOnly is the allow list tests on 127.0.0.1 relay with.
var loopbackOnly = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// The machine's other addresses are refused even when public; its relay
// address is not (see ownAddrs).
func TestTURNOwnAddresses(t *testing.T) {
	own := ownAddrs(net.IPv4(198, 51, 100, 1), net.IPv4(198, 51, 100, 2))
	if own[netip.MustParseAddr("198.51.100.1")] || !own[netip.MustParseAddr("198.51.100.2")] {
		t.Fatalf("own addresses %v: want the listen address and not the relay address", own)
	}
	srv := &TURN{own: own}
	if srv.peerAllowed(net.IPv4(198, 51, 100, 2)) || !srv.peerAllowed(net.IPv4(198, 51, 100, 1)) {
		t.Error("the node's other public address was permitted, or its relay address refused")
	}
}
