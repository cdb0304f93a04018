package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/webrtc/v4"
)

// Paths a blob can take between two members.
const (
	PathDirect  = "direct"  // host, STUN-reflexive or peer-reflexive candidates on both ends
	PathRelayed = "relayed" // through a TURN relay
	PathHTTPS   = "https"   // the aggregator's blob endpoint (the caller's fallback)
)

// conn is one PeerConnection with a member.
type conn struct {
	remote string
	ready  chan struct{} // closed once connected or failed
	gone   chan struct{} // closed when the connection fails or closes
	err    error

	// background: a redial after a live connection to remote broke.
	// Callers do not wait for it (connTo answers ErrNoPath while it runs):
	// the remote may be gone for good (a killed host), and waiting
	// ConnectTimeout for it would stall every exchange that has a fallback.
	background bool

	mu   sync.Mutex
	pc   *webrtc.PeerConnection
	dead bool

	path string // PathDirect or PathRelayed, once connected
	pair string // "host→srflx" and the like, for logs

	// remoteMTU is the SCTP packet size the remote reads (its SDP,
	// sctpmtu.go); tuned is set once the association's MTU was decided.
	remoteMTU atomic.Uint32
	tuned     atomic.Bool
}

func newConn(remote string) *conn {
	return &conn{remote: remote, ready: make(chan struct{}), gone: make(chan struct{})}
}

func (c *conn) setPC(pc *webrtc.PeerConnection) {
	c.mu.Lock()
	c.pc = pc
	c.mu.Unlock()
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed, webrtc.PeerConnectionStateDisconnected:
			c.markDead()
		}
	})
}

func (c *conn) markDead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dead {
		c.dead = true
		close(c.gone)
	}
}

// isReady reports whether the connection attempt has ended (either way).
func (c *conn) isReady() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// failed reports a connection that is no use any more.
func (c *conn) failed() bool {
	select {
	case <-c.ready:
	default:
		return false // still connecting: share the attempt
	}
	if c.err != nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

func (c *conn) close() {
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	if pc != nil {
		pc.Close()
	}
	c.markDead()
}

// waitConnected waits for ICE and DTLS to complete (the SCTP association
// follows, and data channels wait for it by themselves).
func (c *conn) waitConnected(ctx context.Context) error {
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	connected := make(chan struct{})
	var once sync.Once
	check := func() {
		if pc.ConnectionState() == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
		}
	}
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed, webrtc.PeerConnectionStateDisconnected:
			c.markDead()
		case webrtc.PeerConnectionStateConnected:
			once.Do(func() { close(connected) })
		}
	})
	check()
	select {
	case <-connected:
		return nil
	case <-c.gone:
		return fmt.Errorf("%w: ICE found no working candidate pair with %s", ErrNoPath, c.remote)
	case <-ctx.Done():
		return fmt.Errorf("%w: connecting to %s: %v", ErrNoPath, c.remote, ctx.Err())
	}
}

// describe records which path ICE chose.
func (c *conn) describe() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.path = PathDirect
	sctp := c.pc.SCTP()
	if sctp == nil {
		return
	}
	pair, err := sctp.Transport().ICETransport().GetSelectedCandidatePair()
	if err != nil || pair == nil {
		return
	}
	if pair.Local.Typ == webrtc.ICECandidateTypeRelay || pair.Remote.Typ == webrtc.ICECandidateTypeRelay {
		c.path = PathRelayed
	}
	c.pair = fmt.Sprintf("%s %s:%d ↔ %s %s:%d", pair.Local.Typ, pair.Local.Address, pair.Local.Port, pair.Remote.Typ, pair.Remote.Address, pair.Remote.Port)
}

// tune raises the association's MTU to what both ends read, once, when
// the pair is on loopback (sctpmtu.go). It runs as a data channel opens:
// the association is up by then, and no blob has been cut into packets.
func (c *conn) tune(p *Peer) {
	mtu := min(c.remoteMTU.Load(), p.loopbackMTU)
	if mtu <= pionMTU || c.tuned.Swap(true) {
		return
	}
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	sctp := pc.SCTP()
	if sctp == nil {
		return
	}
	pair, err := sctp.Transport().ICETransport().GetSelectedCandidatePair()
	if err != nil || !loopbackPair(pair) {
		return
	}
	if err := raiseSCTPMTU(sctp, mtu); err != nil {
		p.logf("p2p: SCTP packets to %s stay at %d bytes: %v", c.remote, pionMTU, err)
	}
}

// finish ends a dial.
func (c *conn) finish(p *Peer, err error) {
	if err != nil {
		if !errors.Is(err, ErrNoPath) {
			err = fmt.Errorf("%w: %w", ErrNoPath, err) // callers try another aggregator, or HTTPS
		}
		c.err = err
		c.close()
		p.mu.Lock()
		p.fails[c.remote]++
		next := time.Now().Add(p.backoff(p.fails[c.remote]))
		p.down[c.remote] = next
		p.mu.Unlock()
		p.counter(c.remote).failedDial()
		p.logf("p2p: no data channel to %s: %v (candidates: %s; next attempt after %s)", c.remote, err, p.scope, next.Format(time.TimeOnly))
	} else {
		c.describe()
		p.mu.Lock()
		delete(p.down, c.remote)
		delete(p.fails, c.remote)
		p.mu.Unlock()
		p.counter(c.remote).connected(c.path, c.pair)
		p.track(c)
		p.logf("p2p: connected to %s, path %s (%s)", c.remote, c.path, c.pair)
	}
	close(c.ready)
}
