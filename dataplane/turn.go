package dataplane

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
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
	// BandwidthBytes bounds each relay's traffic in each direction, in
	// bytes per second (0: unlimited).
	BandwidthBytes int64
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
	refused atomic.Int64 // allocations refused at the cap
}

// TURNStats are a TURN server's metrics.
type TURNStats struct {
	Listen       string `json:"listen"`
	Allocations  int    `json:"allocations"`
	RelayedBytes int64  `json:"relayed_bytes"`
	Refused      int64  `json:"refused_allocations"`
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
	pc, err := net.ListenPacket("udp4", cfg.Listen)
	if err != nil {
		return nil, diag.New(diag.P2PConfig, "turn_listen", "cannot listen on %s: %v", cfg.Listen, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	var sec [32]byte
	rand.Read(sec[:])
	t := &TURN{cfg: cfg, secret: base64.StdEncoding.EncodeToString(sec[:]), addr: pc.LocalAddr().(*net.UDPAddr)}
	lf := logging.NewDefaultLoggerFactory()
	lf.DefaultLogLevel = logging.LogLevelDisabled
	// The quota handler runs on the server's goroutines, which can start
	// serving before NewServer returns: the pointer is published atomically.
	var srv atomic.Pointer[turn.Server]
	t.srv, err = turn.NewServer(turn.ServerConfig{
		Realm:         cfg.Realm,
		LoggerFactory: lf,
		AuthHandler:   turn.LongTermTURNRESTAuthHandler(t.secret, lf.NewLogger("turn")),
		QuotaHandler: func(_, _ string, _ net.Addr) bool {
			if s := srv.Load(); s != nil && s.AllocationCount() >= cfg.MaxAllocations {
				t.refused.Add(1)
				return false
			}
			return true
		},
		PacketConnConfigs: []turn.PacketConnConfig{{
			PacketConn: pc,
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
	return TURNStats{Listen: t.addr.String(), Allocations: t.srv.AllocationCount(), RelayedBytes: t.relayed.Load(), Refused: t.refused.Load()}
}

// Close stops the server and its relays.
func (t *TURN) Close() error { return t.srv.Close() }

// limitedRelays hands out relays that count their bytes and, with
// BandwidthBytes set, hold each direction to it.
type limitedRelays struct {
	turn.RelayAddressGeneratorStatic
	t *TURN
}

func (r *limitedRelays) AllocatePacketConn(conf turn.AllocateListenerConfig) (net.PacketConn, net.Addr, error) {
	pc, addr, err := r.RelayAddressGeneratorStatic.AllocatePacketConn(conf)
	if err != nil {
		return nil, nil, err
	}
	lc := &limitedConn{PacketConn: pc, t: r.t}
	if bw := r.t.cfg.BandwidthBytes; bw > 0 {
		burst := int(max(bw/10, 64<<10))
		lc.in = rate.NewLimiter(rate.Limit(bw), burst)
		lc.out = rate.NewLimiter(rate.Limit(bw), burst)
	}
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
		if c.in != nil {
			c.in.WaitN(context.Background(), n)
		}
	}
	return n, addr, err
}

func (c *limitedConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.out != nil {
		c.out.WaitN(context.Background(), len(b))
	}
	n, err := c.PacketConn.WriteTo(b, addr)
	c.t.relayed.Add(int64(n))
	return n, err
}
