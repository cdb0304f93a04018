package dataplane

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/logging"
	"github.com/pion/turn/v5"
	"golang.org/x/time/rate"

	"github.com/scellis/scellis/diag"
)

// TURNConfig configures the STUN/TURN server an aggregator node runs.
type TURNConfig struct {
	// Listen is the UDP address to serve STUN and TURN on (":3478").
	Listen string
	// RelayIP is the address peers reach this node's relays at (its
	// public address); it is also the host of the URLs handed out.
	RelayIP net.IP
	// Realm of the long-term credentials (default "scellis").
	Realm string
	// MaxAllocations bounds the relays open at once (default 64).
	MaxAllocations int
	// MaxPerMember bounds the relays one member (one credential's
	// holder: a member, or one browser volunteer) holds at once
	// (default 4), so that one credential cannot take every relay.
	MaxPerMember int
	// BandwidthBytes bounds each relay's traffic in each direction, in
	// bytes per second (default DefaultTURNBandwidth).
	BandwidthBytes int64
	// AllowPeers are address ranges relays may reach although they are
	// not public unicast addresses (loopback, private ranges) or are the
	// node's own: for federations on one machine or one private network.
	// Empty (the default): relays reach public unicast addresses only.
	AllowPeers []netip.Prefix
	// CredentialTTL is how long handed-out credentials stay valid
	// (default 10 min).
	CredentialTTL time.Duration
}

// TURN is an embedded STUN/TURN server (pion/turn) with TURN REST-style
// credentials: the username is "<expiry>:<member>", the password an HMAC
// of it under a secret that never leaves this node, so a credential names
// the federation member it was issued to (over mutual TLS) and dies at
// its expiry.
type TURN struct {
	cfg    TURNConfig
	srv    *turn.Server
	secret string
	addr   *net.UDPAddr

	relayed atomic.Int64 // bytes through relays, both ways
	refused atomic.Int64 // allocations refused at a cap
	denied  atomic.Int64 // permissions refused: the peer address is not allowed

	own      map[netip.Addr]bool // this machine's addresses, refused as peers
	mu       sync.Mutex
	byMember map[string]int // open relays by member
}

// DefaultTURNBandwidth is each relay's default cap per direction: 4 MiB/s,
// several video calls' worth and far above what blob transfers between
// two sites need to finish in seconds, but small enough that a handful of
// relays cannot fill the node's uplink.
const DefaultTURNBandwidth = 4 << 20

// TURNStats are a TURN server's metrics.
type TURNStats struct {
	Listen       string `json:"listen"`
	Allocations  int    `json:"allocations"`
	RelayedBytes int64  `json:"relayed_bytes"`
	Refused      int64  `json:"refused_allocations"`
	Denied       int64  `json:"refused_peers"`
}

// StartTURN starts a STUN/TURN server.
func StartTURN(cfg TURNConfig) (*TURN, error) {
	if cfg.RelayIP == nil {
		return nil, diag.New(diag.P2PConfig, "turn_relay_ip", "the TURN relay needs the address peers reach it at").
			WithHelp("set turn_relay_ip to this node's public IP address")
	}
	cfg.Realm = cmpOr(cfg.Realm, "scellis")
	cfg.MaxAllocations = cmpOr(cfg.MaxAllocations, 64)
	cfg.CredentialTTL = cmpOr(cfg.CredentialTTL, 10*time.Minute)
	cfg.MaxPerMember = cmpOr(cfg.MaxPerMember, 4)
	cfg.BandwidthBytes = cmpOr(cfg.BandwidthBytes, DefaultTURNBandwidth)
	pc, err := net.ListenPacket("udp4", cfg.Listen)
	if err != nil {
		return nil, diag.New(diag.P2PConfig, "turn_listen", "cannot listen on %s: %v", cfg.Listen, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	var sec [32]byte
	rand.Read(sec[:])
	t := &TURN{cfg: cfg, secret: base64.StdEncoding.EncodeToString(sec[:]), addr: pc.LocalAddr().(*net.UDPAddr), byMember: map[string]int{}}
	t.own = ownAddrs(cfg.RelayIP, t.addr.IP)
	lf := logging.NewDefaultLoggerFactory()
	lf.DefaultLogLevel = logging.LogLevelDisabled
	// The quota handler runs on the server's goroutines, which can start
	// serving before NewServer returns: the pointer is published atomically.
	var srv atomic.Pointer[turn.Server]
	t.srv, err = turn.NewServer(turn.ServerConfig{
		Realm:         cfg.Realm,
		LoggerFactory: lf,
		AuthHandler:   turn.LongTermTURNRESTAuthHandler(t.secret, lf.NewLogger("turn")),
		QuotaHandler: func(member, _ string, _ net.Addr) bool {
			s := srv.Load()
			if (s != nil && s.AllocationCount() >= cfg.MaxAllocations) || t.heldBy(member) >= cfg.MaxPerMember {
				t.refused.Add(1)
				return false
			}
			return true
		},
		EventHandler: turn.EventHandler{
			OnAllocationCreated: func(_, _ net.Addr, _, member, _ string, _ net.Addr, _ int) { t.hold(member, 1) },
			OnAllocationDeleted: func(_, _ net.Addr, _, member, _ string) { t.hold(member, -1) },
		},
		PacketConnConfigs: []turn.PacketConnConfig{{
			PacketConn:        pc,
			PermissionHandler: func(_ net.Addr, peer net.IP) bool { return t.peerAllowed(peer) },
			RelayAddressGenerator: &limitedRelays{
				RelayAddressGeneratorStatic: turn.RelayAddressGeneratorStatic{RelayAddress: cfg.RelayIP, Address: t.addr.IP.String()},
				t:                           t,
			},
		}},
	})
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dataplane: starting TURN: %w", err)
	}
	srv.Store(t.srv)
	return t, nil
}

// Addr is the UDP address the server listens on.
func (t *TURN) Addr() *net.UDPAddr { return t.addr }

// Credentials returns the STUN and TURN servers for member, with a
// credential valid for CredentialTTL.
func (t *TURN) Credentials(member string) []ICEServer {
	host := net.JoinHostPort(t.cfg.RelayIP.String(), fmt.Sprint(t.addr.Port))
	user, pass, err := turn.GenerateLongTermTURNRESTCredentials(t.secret, member, t.cfg.CredentialTTL)
	if err != nil {
		return []ICEServer{{URLs: []string{"stun:" + host}}}
	}
	return []ICEServer{
		{URLs: []string{"stun:" + host}},
		{URLs: []string{"turn:" + host + "?transport=udp"}, Username: user, Credential: pass},
	}
}

// Stats returns the server's metrics.
func (t *TURN) Stats() TURNStats {
	return TURNStats{Listen: t.addr.String(), Allocations: t.srv.AllocationCount(), RelayedBytes: t.relayed.Load(), Refused: t.refused.Load(), Denied: t.denied.Load()}
}

// heldBy is how many relays member holds now.
func (t *TURN) heldBy(member string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byMember[member]
}

// hold counts a relay member opened (d = 1) or lost (d = -1).
func (t *TURN) hold(member string, d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byMember[member] += d; t.byMember[member] <= 0 {
		delete(t.byMember, member)
	}
}

// peerAllowed is pion/turn's permission hook (CreatePermission and
// ChannelBind): a relay may reach peer only if it is an address a member
// or volunteer can legitimately have — public unicast, not this machine —
// or lies in a range the operator allowed. Without it a credential (which
// any browser volunteer gets) turns the relay into a proxy into the
// node's own network: its loopback services, its private LAN, cloud
// metadata at 169.254.169.254.
func (t *TURN) peerAllowed(peer net.IP) bool {
	a, ok := netip.AddrFromSlice(peer)
	if !ok {
		t.denied.Add(1)
		return false
	}
	a = a.Unmap()
	for _, p := range t.cfg.AllowPeers {
		if p.Contains(a) {
			return true
		}
	}
	if !PublicUnicast(a) || t.own[a] {
		t.denied.Add(1)
		return false
	}
	return true
}

// nonPublic are ranges that IsGlobalUnicast and IsPrivate leave in but
// that no peer on the Internet has: shared address space (carrier NAT),
// IETF protocol assignments, benchmarking, reserved, and the IPv6
// prefixes that translate to IPv4 (NAT64, 6to4) and so could reach a
// private IPv4 address.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2002::/16"),
}

// PublicUnicast reports whether a is an address a peer on the public
// Internet can have: not loopback, private, link-local, unspecified,
// multicast or broadcast, nor in a reserved or translation range.
func PublicUnicast(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || a.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// ownAddrs are this machine's addresses (its interfaces' and the listen
// address) except relayIP: a relay to them would reach services bound to
// the node's other addresses from outside. relayIP stays allowed, because
// the node is itself a legitimate relay peer — a worker behind a
// symmetric NAT reaches this very aggregator's data-plane peer through
// this relay — and is reachable from the Internet anyway; a relay to the
// TURN port itself is refused in limitedConn.WriteTo.
func ownAddrs(relayIP net.IP, ips ...net.IP) map[netip.Addr]bool {
	own := map[netip.Addr]bool{}
	defer func() {
		if a, ok := netip.AddrFromSlice(relayIP); ok {
			delete(own, a.Unmap())
		}
	}()
	add := func(ip net.IP) {
		if a, ok := netip.AddrFromSlice(ip); ok && !a.IsUnspecified() {
			own[a.Unmap()] = true
		}
	}
	for _, ip := range ips {
		add(ip)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				add(n.IP)
			}
		}
	}
	return own
}

// Close stops the server and its relays.
func (t *TURN) Close() error { return t.srv.Close() }

// limitedRelays hands out relays that count their bytes and hold each
// direction to BandwidthBytes.
type limitedRelays struct {
	turn.RelayAddressGeneratorStatic
	t *TURN
}

func (r *limitedRelays) AllocatePacketConn(conf turn.AllocateListenerConfig) (net.PacketConn, net.Addr, error) {
	pc, addr, err := r.RelayAddressGeneratorStatic.AllocatePacketConn(conf)
	if err != nil {
		return nil, nil, err
	}
	bw := r.t.cfg.BandwidthBytes
	burst := int(max(bw/10, 64<<10))
	lc := &limitedConn{PacketConn: pc, t: r.t, in: rate.NewLimiter(rate.Limit(bw), burst), out: rate.NewLimiter(rate.Limit(bw), burst)}
	return lc, addr, nil
}

type limitedConn struct {
	net.PacketConn
	t       *TURN
	in, out *rate.Limiter
}

func (c *limitedConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(b)
	if n > 0 {
		c.t.relayed.Add(int64(n))
		c.in.WaitN(context.Background(), n)
	}
	return n, addr, err
}

// errRelayLoop refuses a relay to the TURN server's own port, which would
// loop the server's traffic through itself.
var errRelayLoop = errors.New("dataplane: a relay to the TURN server itself is refused")

func (c *limitedConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if u, ok := addr.(*net.UDPAddr); ok && u.Port == c.t.addr.Port && (u.IP.Equal(c.t.cfg.RelayIP) || u.IP.Equal(c.t.addr.IP)) {
		c.t.denied.Add(1)
		return 0, errRelayLoop
	}
	c.out.WaitN(context.Background(), len(b))
	n, err := c.PacketConn.WriteTo(b, addr)
	c.t.relayed.Add(int64(n))
	return n, err
}
