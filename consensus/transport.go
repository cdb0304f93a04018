package consensus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// alpnRaft is the ALPN protocol of Raft traffic, so a Raft listener and an
// API listener cannot be confused with each other even under one key.
const alpnRaft = "scellis-raft/1"

// tlsStream is the raft.StreamLayer of a node: TCP with TLS 1.3 and mutual
// authentication on every connection, inbound and outbound.
//
// Inbound connections are authenticated by serverTLS (the caller pins the
// federation's keys there). Outbound, raft hands Dial an address; resolve
// maps it to the server ID of the Raft configuration and clientTLS(id)
// pins that server's key, so a server listed under one ID cannot be answered
// by another member's key. An address no server has is never dialled.
//
// The stream tracks every connection it made or accepted and closes them all
// on Close: raft's NetworkTransport only closes its listener, which would
// leave peers' connection handlers and pooled connections alive.
type tlsStream struct {
	ln        net.Listener
	advertise net.Addr
	serverTLS *tls.Config
	clientTLS func(serverID string) *tls.Config
	resolve   func(addr string) (serverID string, ok bool)
	timeout   time.Duration

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

var _ raft.StreamLayer = (*tlsStream)(nil)

// newTLSStream wraps ln. serverTLS is cloned and forced to TLS 1.3.
func newTLSStream(ln net.Listener, advertise net.Addr, serverTLS *tls.Config,
	clientTLS func(string) *tls.Config, resolve func(string) (string, bool), timeout time.Duration) *tlsStream {
	return &tlsStream{
		ln:        ln,
		advertise: advertise,
		serverTLS: hardenTLS(serverTLS),
		clientTLS: clientTLS,
		resolve:   resolve,
		timeout:   timeout,
		conns:     map[*trackedConn]struct{}{},
	}
}

// hardenTLS clones c with TLS 1.3 as the minimum and the Raft ALPN protocol.
func hardenTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	c.NextProtos = []string{alpnRaft}
	return c
}

// Accept returns the next inbound connection as a TLS server connection. The
// handshake runs on the connection's first Read or Write (in raft's
// per-connection goroutine, so one slow client cannot stall the accept loop),
// bounded by the I/O timeout; a client whose certificate serverTLS rejects
// gets an alert and the connection fails before any RPC is read.
func (s *tlsStream) Accept() (net.Conn, error) {
	raw, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(tls.Server(raw, s.serverTLS))
}

// Dial opens an authenticated connection to the server at address.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	conn, err := s.dial(context.Background(), string(address), "", timeout)
	if err != nil {
		return nil, err
	}
	return s.track(conn)
}

// dial handshakes with the server at addr as serverID (looked up from addr
// when empty). The returned connection has completed the handshake, so the
// server's certificate has been checked by clientTLS(serverID).
func (s *tlsStream) dial(ctx context.Context, addr, serverID string, timeout time.Duration) (*tls.Conn, error) {
	if serverID == "" {
		id, ok := s.resolve(addr)
		if !ok {
			return nil, fmt.Errorf("consensus: no server at %s in the configuration; refusing to dial it", addr)
		}
		serverID = id
	}
	cfg := s.clientTLS(serverID)
	if cfg == nil {
		return nil, fmt.Errorf("consensus: no client TLS config for server %q; refusing to dial it", serverID)
	}
	if timeout <= 0 {
		timeout = s.timeout
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout, LocalAddr: sourceFor(s.ln.Addr(), addr)}, Config: hardenTLS(cfg)}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("consensus: dial %s at %s: %w", serverID, addr, err)
	}
	return c.(*tls.Conn), nil
}

// sourceFor is the local address to dial target from: the IP this node's
// listener is bound to, when it is a specific address of the same kind
// (loopback or not) as the target's, so a node's Raft traffic leaves from
// the address its peers know it by (multi-homed hosts; tests that tell
// nodes apart by source address). nil lets the kernel choose.
func sourceFor(listen net.Addr, target string) net.Addr {
	la, ok := listen.(*net.TCPAddr)
	if !ok || la.IP == nil || la.IP.IsUnspecified() {
		return nil
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil
	}
	tip := net.ParseIP(host)
	if tip == nil || tip.IsLoopback() != la.IP.IsLoopback() || (tip.To4() == nil) != (la.IP.To4() == nil) {
		return nil
	}
	return &net.TCPAddr{IP: la.IP}
}

// track registers c so Close can close it; it refuses new connections once
// the stream is closed.
func (s *tlsStream) track(c *tls.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, s: s}
	s.conns[tc] = struct{}{}
	return tc, nil
}

// Close closes the listener and every connection of the stream.
func (s *tlsStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()

	err := s.ln.Close()
	for c := range conns {
		// Close the TCP connection under TLS: no close_notify, which could
		// wait on a peer that stopped reading.
		_ = c.Conn.NetConn().Close()
	}
	return err
}

// Addr is the advertised address: raft sends it to followers as the leader's
// address and stores it in the configuration.
func (s *tlsStream) Addr() net.Addr { return s.advertise }

// trackedConn is a TLS connection of a stream. Its first Read or Write
// completes the handshake within the stream's I/O timeout.
type trackedConn struct {
	*tls.Conn
	s *tlsStream

	once   sync.Once
	hsErr  error
	closed sync.Once
}

func (c *trackedConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
		defer cancel()
		if err := c.Conn.HandshakeContext(ctx); err != nil {
			c.hsErr = fmt.Errorf("consensus: TLS handshake with %s: %w", c.Conn.RemoteAddr(), err)
		}
	})
	return c.hsErr
}

func (c *trackedConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *trackedConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	err := net.ErrClosed
	c.closed.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		err = c.Conn.Close()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
