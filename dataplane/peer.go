package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// ICEServer is a STUN or TURN server as handed to a peer (the WebRTC
// RTCIceServer shape).
type ICEServer struct {
	URLs       []string `json:"urls"`
	Username   string   `json:"username,omitempty"`
	Credential string   `json:"credential,omitempty"`
}

// ICE policies: all tries direct paths first and the relay after them;
// relay uses TURN only (a site that must not reveal its addresses to
// peers, or a network that lets nothing else through).
const (
	PolicyAll   = "all"
	PolicyRelay = "relay"
)

// Signaller carries signalling messages between this peer and the
// others, through an aggregator's mailbox.
type Signaller interface {
	// Send leaves s in its recipient's mailbox.
	Send(ctx context.Context, s Signal) error
	// Receive returns this member's mail, waiting a while (a long poll)
	// when there is none; it may return none.
	Receive(ctx context.Context) ([]Signal, error)
}

// Config sets up a Peer.
type Config struct {
	Identity *identity.Identity
	Name     string // this member's name in Fed
	Fed      *identity.Federation
	Signal   Signaller
	// ICE returns the STUN/TURN servers to use for one connection
	// (TURN credentials are short-lived, so it is asked each time). Nil:
	// host candidates only.
	ICE func(ctx context.Context) ([]ICEServer, error)
	// Policy is PolicyAll (default) or PolicyRelay.
	Policy string
	// Store serves other members' Gets and receives their Puts; nil
	// serves nothing (a worker only fetches and sends).
	Store Store
	// Authorize decides whether peer may get ("get") or put ("put") ref
	// here; nil allows every federation member.
	Authorize func(peer identity.Member, op string, ref content.Ref) error
	// Services answer other members' Calls, by service name (call.go);
	// nil answers none.
	Services map[string]Service
	// ConnectTimeout bounds one connection attempt, signalling and ICE
	// (default 12 s). Get, Put, Call and Probe wait for a first attempt;
	// a redial after a live connection broke runs in the background
	// (connTo). A member's blob mover (Blobs) waits for none: its
	// connections are made in the background from the start.
	ConnectTimeout time.Duration
	// RetryMin and RetryAfter: after a failed connection attempt to a
	// member, no new one for RetryMin (default 2 s), doubling with each
	// further failure up to RetryAfter (default 1 min); a success starts
	// over. Callers fall back at once meanwhile, and a member that cannot
	// be reached costs one attempt a minute, not one per blob. Avoid
	// holds a member off for RetryAfter.
	RetryMin   time.Duration
	RetryAfter time.Duration
	// Chunk is the data-channel message size (default DefaultChunk).
	Chunk int
	// Loopback forces loopback-only candidates. Deprecated: implied when
	// every member address in the federation is loopback (scope.go); it
	// matters only for a federation whose hostnames resolve to loopback.
	Loopback bool
	// Logf reports connections and their paths for people; nil is silent.
	Logf func(format string, args ...any)
}

// Store is where a peer's served blobs live (a *blob.Store, or an
// aggregator's view that also fetches from the other nodes). Put must
// refuse bytes that do not hash to ref.
type Store interface {
	Get(ref content.Ref) ([]byte, error)
	Put(ref content.Ref, r io.Reader) error
}

var _ Store = (*blob.Store)(nil)

// tuning holds the SCTP settings the benchmarks compare
// (bench_test.go); production uses these values.
//
// On loopback (a federation on one machine) the receive buffer, which
// bounds the bytes in flight, stays under the 1 MB that pion/webrtc and
// pion/ice queue per connection between the socket and DTLS: a burst
// larger than that is dropped there, and a drop the fast retransmit
// misses costs pion/sctp's 1 s minimum retransmission timeout. A minimum
// congestion window of several large packets keeps a new association
// from sending one packet and waiting out the receiver's 200 ms delayed
// acknowledgement (sctpmtu.go: packets are 8 kB there).
var tuning = struct {
	recvBuffer   uint32
	zeroChecksum bool
	minCwnd      uint32
	caStep       uint32
	fastRtxWnd   uint32
	rtoMax       time.Duration

	// loopbackMTU: the SCTP packets sent on a loopback pair (0: pion's
	// 1191 bytes; sctpmtu.go).
	loopbackMTU        uint32
	loopbackRecvBuffer uint32
	loopbackMinCwnd    uint32
}{recvBuffer: 8 << 20, zeroChecksum: true, loopbackMTU: maxLoopbackMTU, loopbackRecvBuffer: 900 << 10, loopbackMinCwnd: 64 << 10}

// DefaultChunk is the message size of a transfer. SCTP fragments each
// message into ~1.2 kB packets anyway (8 kB on a loopback pair); larger messages mean fewer reads
// and writes through pion's stream layer (see bench_test.go).
const DefaultChunk = 64 << 10

// Peer is one member's end of the data plane: it dials other members,
// answers their offers, and moves blobs over data channels.
type Peer struct {
	cfg  Config
	api  *webrtc.API
	cert webrtc.Certificate
	fp   string

	// scope is where ICE candidates come from (scope.go).
	scope *scope
	// loopbackMTU is the SCTP packet size sent on a loopback pair.
	loopbackMTU uint32
	// done is closed by Close: background work for this peer ends.
	done chan struct{}

	mu      sync.Mutex
	conns   map[string]*conn        // remote member → live (or connecting) connection
	waiting map[string]chan Signal  // session → the dialer waiting for its answer
	stats   map[string]*pairCounter // remote member → counters
	down    map[string]time.Time    // remote member → no new dial before
	fails   map[string]int          // remote member → failed attempts in a row
	open    map[*conn]struct{}      // connected, either side dialing, until gone
	closed  bool
	// answering: remote member → its offers being answered now;
	// answered: remote/session → when the offer was taken, so a replayed
	// offer (the same signed bytes, relayed again) is not answered twice.
	answering map[string]int
	answered  map[string]time.Time
	// browsers: volunteer → its browser connections open or being set
	// up (browser.go).
	browsers map[string]int
}

// Bounds on the offers a peer answers: each costs a PeerConnection (ICE
// gathering, sockets), so one member cannot make a peer hold more than
// maxAnswering of them, and an offer is answered once.
const (
	maxAnswering = 4
	answeredTTL  = 10 * time.Minute
	maxAnswered  = 4096
)

// takeOffer reports whether to answer s, counting it as being answered
// (doneOffer gives its place back): not a replay, and its sender within
// maxAnswering.
func (p *Peer) takeOffer(s Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.answering == nil {
		p.answering, p.answered = map[string]int{}, map[string]time.Time{}
	}
	now := time.Now()
	key := s.From + "/" + s.Session
	if at, ok := p.answered[key]; ok && now.Sub(at) < answeredTTL {
		return false
	}
	if len(p.answered) >= maxAnswered {
		for k, at := range p.answered {
			if now.Sub(at) >= answeredTTL {
				delete(p.answered, k)
			}
		}
	}
	if p.answering[s.From] >= maxAnswering || len(p.answered) >= maxAnswered {
		return false
	}
	p.answering[s.From]++
	p.answered[key] = now
	return true
}

func (p *Peer) doneOffer(from string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.answering[from]--; p.answering[from] <= 0 {
		delete(p.answering, from)
	}
}

// ErrNoPath is returned when no data-channel connection could be set up
// with a peer (signalling failed, ICE found no path, or the peer did not
// answer): callers fall back to HTTPS.
var ErrNoPath = errors.New("dataplane: no data-channel path to the peer")

// New returns a peer; Run must be running for it to answer offers and
// receive answers.
func New(cfg Config) (*Peer, error) {
	if cfg.Identity == nil || cfg.Fed == nil || cfg.Signal == nil {
		return nil, errors.New("dataplane: a peer needs an identity, a federation and a signaller")
	}
	if _, ok := cfg.Fed.Member(cfg.Name); !ok {
		return nil, diag.New(diag.P2PConfig, cfg.Name, "%q is not a member of the federation", cfg.Name)
	}
	switch cfg.Policy {
	case "":
		cfg.Policy = PolicyAll
	case PolicyAll, PolicyRelay:
	default:
		return nil, diag.New(diag.P2PConfig, cfg.Name, "ice_policy %q is neither all nor relay", cfg.Policy).
			WithHelp("use all (direct first, relay after) or relay (TURN only)")
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = DefaultChunk
	}
	if cfg.Chunk > 64<<10 {
		cfg.Chunk = 64 << 10 // SCTP's default maximum message size
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 12 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Minute
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = min(2*time.Second, cfg.RetryAfter)
	}
	// A fresh DTLS key per process: it is bound to the member by the
	// signed fingerprint, never by a CA.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := webrtc.GenerateCertificate(key)
	if err != nil {
		return nil, err
	}
	fps, err := cert.GetFingerprints()
	if err != nil || len(fps) == 0 {
		return nil, fmt.Errorf("dataplane: certificate fingerprint: %v", err)
	}
	var se webrtc.SettingEngine
	if n, err := newBufNet(); err == nil {
		se.SetNet(n)
	}
	se.DetachDataChannels()
	sc := scopeOf(cfg.Fed, cfg.Loopback)
	se.SetIncludeLoopbackCandidate(sc.loopback)
	se.SetIPFilter(sc.ipOK)
	se.SetInterfaceFilter(sc.interfaceOK)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	// Members never gather mDNS (.local) candidates: they hide host
	// addresses from web pages, which members are not. A browser tab's
	// candidates may be .local names, which a node resolves (query only)
	// to reach a tab on its own LAN directly. On loopback there is no
	// such tab to find, and the mDNS socket (a multicast group on
	// 224.0.0.251:5353) would be one more thing that fails in a namespace
	// with only lo. Mode 0 is not "disabled": pion reads it as query only.
	if sc.loopback {
		se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	} else {
		se.SetICEMulticastDNSMode(ice.MulticastDNSModeQueryOnly)
	}
	recvBuffer, minCwnd := tuning.recvBuffer, tuning.minCwnd
	if sc.loopback {
		recvBuffer, minCwnd = tuning.loopbackRecvBuffer, max(minCwnd, tuning.loopbackMinCwnd)
	}
	se.SetReceiveMTU(receiveMTU)
	se.SetSCTPMaxReceiveBufferSize(recvBuffer)
	// Both ends are Scellis peers over DTLS, which already authenticates
	// every packet: SCTP's CRC32c adds CPU and nothing else (RFC 9653).
	se.EnableSCTPZeroChecksum(tuning.zeroChecksum)
	se.SetSCTPMinCwnd(minCwnd)
	se.SetSCTPCwndCAStep(tuning.caStep)
	se.SetSCTPFastRtxWnd(tuning.fastRtxWnd)
	se.SetSCTPRTOMax(tuning.rtoMax)

	// A host that dies (a killed leader) is noticed after 3 s without an
	// answer to the keepalives; a false alarm under load only sends some
	// exchanges over the fallback until the background redial succeeds.
	se.SetICETimeouts(3*time.Second, 6*time.Second, 500*time.Millisecond)
	return &Peer{
		cfg: cfg, api: webrtc.NewAPI(webrtc.WithSettingEngine(se)), cert: *cert,
		fp:    fingerprintString(fps[0].Algorithm, fps[0].Value),
		scope: sc, loopbackMTU: tuning.loopbackMTU, done: make(chan struct{}),
		conns: map[string]*conn{}, down: map[string]time.Time{}, fails: map[string]int{}, waiting: map[string]chan Signal{}, stats: map[string]*pairCounter{},
		open: map[*conn]struct{}{},
	}, nil
}

// Scope says where this peer's ICE candidates come from ("loopback",
// or which interfaces), for logs.
func (p *Peer) Scope() string { return p.scope.String() }

// backoff is how long to wait after the n-th failed attempt in a row.
func (p *Peer) backoff(n int) time.Duration {
	d := p.cfg.RetryMin
	for i := 1; i < n && d < p.cfg.RetryAfter; i++ {
		d *= 2
	}
	return min(d, p.cfg.RetryAfter)
}

func (p *Peer) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}

// Run receives signalling until ctx ends: answers to this peer's offers
// go to the dialer waiting for them, offers from others are answered.
func (p *Peer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		mail, err := p.cfg.Signal.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for _, s := range mail {
			switch s.Kind {
			case KindAnswer:
				p.mu.Lock()
				ch, ok := p.waiting[s.Session]
				p.mu.Unlock()
				if ok {
					select {
					case ch <- s:
					default:
					}
				}
			case KindOffer:
				if !p.takeOffer(s) {
					p.logf("p2p: ignored an offer from %s (a replay, or %d of its offers are being answered)", s.From, maxAnswering)
					continue
				}
				go func() {
					defer p.doneOffer(s.From)
					p.answer(ctx, s)
				}()
			}
		}
	}
	return ctx.Err()
}

// Close ends every connection.
func (p *Peer) Close() {
	p.mu.Lock()
	if !p.closed {
		close(p.done)
	}
	p.closed = true
	conns := make([]*conn, 0, len(p.conns)+len(p.open))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	for c := range p.open {
		conns = append(conns, c) // the connections others dialed too
	}
	p.conns = map[string]*conn{}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// track counts c among the open connections until it is gone.
func (p *Peer) track(c *conn) {
	p.mu.Lock()
	p.open[c] = struct{}{}
	p.mu.Unlock()
	go func() {
		<-c.gone
		p.mu.Lock()
		delete(p.open, c)
		p.mu.Unlock()
	}()
}

// live counts the open connections by path.
func (p *Peer) live() (direct, relayed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		if c.path == PathRelayed {
			relayed++
		} else {
			direct++
		}
	}
	return direct, relayed
}

func (p *Peer) configuration(ctx context.Context) (webrtc.Configuration, error) {
	cfg := webrtc.Configuration{Certificates: []webrtc.Certificate{p.cert}}
	if p.cfg.Policy == PolicyRelay {
		cfg.ICETransportPolicy = webrtc.ICETransportPolicyRelay
	}
	if p.cfg.ICE == nil {
		return cfg, nil
	}
	if p.scope.loopback && p.cfg.Policy != PolicyRelay {
		// Loopback host candidates always pair on one machine: STUN
		// would only find the same address again, and a relay would be
		// chosen only once the peer is gone. Asking for credentials
		// would cost a request per connection for nothing.
		return cfg, nil
	}
	servers, err := p.cfg.ICE(ctx)
	if err != nil {
		return cfg, fmt.Errorf("ICE servers: %w", err)
	}
	for _, s := range servers {
		urls := s.URLs
		if p.scope.loopback {
			// A server off this machine would be reached from a
			// loopback socket (it cannot be) or hand out an address of
			// the machine that is not loopback: only loopback servers.
			urls = loopbackURLs(urls)
		}
		if len(urls) > 0 {
			cfg.ICEServers = append(cfg.ICEServers, webrtc.ICEServer{URLs: urls, Username: s.Username, Credential: s.Credential})
		}
	}
	return cfg, nil
}

// loopbackURLs keeps the STUN/TURN URLs whose host is a loopback address
// ("stun:127.0.0.1:3478", "turn:127.0.0.1:3478?transport=udp").
func loopbackURLs(urls []string) []string {
	var out []string
	for _, u := range urls {
		_, rest, _ := strings.Cut(u, ":")
		rest, _, _ = strings.Cut(rest, "?")
		host, _, err := net.SplitHostPort(rest)
		if err != nil {
			host = rest // no port: the scheme's default
		}
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || strings.EqualFold(host, "localhost") {
			out = append(out, u)
		}
	}
	return out
}

func newSession() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Avoid closes the connection to member, if any, and dials it no more for
// the RetryAfter window: its transfers go over the HTTPS fallback meanwhile.
// A member uses it when the path worked but did not serve its purpose (the
// aggregator took a result it could not make durable).
func (p *Peer) Avoid(member string) {
	p.mu.Lock()
	c := p.conns[member]
	delete(p.conns, member)
	p.down[member] = time.Now().Add(p.cfg.RetryAfter)
	p.mu.Unlock()
	if c != nil {
		go c.close() // closing a connection to a silent peer may wait on it
	}
	p.logf("p2p: avoiding %s until %s: blobs go over https meanwhile", member, time.Now().Add(p.cfg.RetryAfter).Format(time.TimeOnly))
}

// connTo returns a live connection to member, dialing one if needed.
// Concurrent callers share one attempt. It waits for a first attempt,
// not for a redial after a live connection broke.
func (p *Peer) connTo(ctx context.Context, member string) (*conn, error) {
	return p.connect(ctx, member, false)
}

// liveConn returns the connection to member if one is up now; it never
// dials or waits.
func (p *Peer) liveConn(member string) *conn {
	p.mu.Lock()
	c := p.conns[member]
	p.mu.Unlock()
	if c == nil || !c.isReady() || c.failed() {
		return nil
	}
	return c
}

// retryAt is when member may be dialled again (zero: now).
func (p *Peer) retryAt(member string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down[member]
}

// connect is connTo; always also waits for a background redial (for a
// caller that is itself in the background: Blobs.keep).
func (p *Peer) connect(ctx context.Context, member string, always bool) (*conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrNoPath
	}
	c, ok := p.conns[member]
	broke := false
	if ok && c.failed() {
		delete(p.conns, member)
		ok = false
		broke = c.err == nil // it was up, and died
	}
	if !ok {
		if until, ok := p.down[member]; ok && time.Now().Before(until) {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: %s (the last attempt failed; next try after %s)", ErrNoPath, member, until.Format(time.TimeOnly))
		}
		c = newConn(member)
		c.background = broke
		p.conns[member] = c
		p.mu.Unlock()
		go p.dial(ctx, c)
	} else {
		p.mu.Unlock()
	}
	if c.background && !c.isReady() && !always {
		return nil, fmt.Errorf("%w: the connection to %s broke; redialling in the background", ErrNoPath, member)
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.err != nil {
		return nil, c.err
	}
	return c, nil
}

// dial makes c: offer, signed; answer, checked; ICE and DTLS.
func (p *Peer) dial(parent context.Context, c *conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), p.cfg.ConnectTimeout)
	defer cancel()
	err := func() error {
		cfg, err := p.configuration(ctx)
		if err != nil {
			return err
		}
		pc, err := p.api.NewPeerConnection(cfg)
		if err != nil {
			return err
		}
		c.setPC(pc)
		// An offer needs an m=application section: open the control
		// channel now (it stays open, unused, for the connection's life).
		if _, err := pc.CreateDataChannel("ctl", nil); err != nil {
			return err
		}
		offer, err := pc.CreateOffer(nil)
		if err != nil {
			return err
		}
		gathered := webrtc.GatheringCompletePromise(pc)
		if err := pc.SetLocalDescription(offer); err != nil {
			return err
		}
		select {
		case <-gathered:
		case <-ctx.Done():
			return fmt.Errorf("gathering ICE candidates: %w", ctx.Err())
		}
		s := Signal{Session: newSession(), From: p.cfg.Name, To: c.remote, Kind: KindOffer, SDP: withMTU(pc.LocalDescription().SDP), Fingerprint: p.fp}
		if err := s.sign(p.cfg.Identity); err != nil {
			return err
		}
		answers := make(chan Signal, 1)
		p.mu.Lock()
		p.waiting[s.Session] = answers
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.waiting, s.Session)
			p.mu.Unlock()
		}()
		if err := p.cfg.Signal.Send(ctx, s); err != nil {
			return fmt.Errorf("sending the offer: %w", err)
		}
		var ans Signal
		select {
		case ans = <-answers:
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer: %w", c.remote, ctx.Err())
		case <-c.gone:
			return fmt.Errorf("closed while waiting for %s's answer", c.remote)
		}
		if ans.From != c.remote || ans.To != p.cfg.Name {
			return diag.New(diag.P2PSignalRefused, ans.From, "an answer for %s came from %s", c.remote, ans.From)
		}
		if err := ans.Verify(p.cfg.Fed); err != nil {
			return err
		}
		c.remoteMTU.Store(sdpMTU(ans.SDP))
		if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: ans.SDP}); err != nil {
			return err
		}
		return c.waitConnected(ctx)
	}()
	c.finish(p, err)
}

// answer handles one offer: checks it, answers it signed, and serves the
// data channels the dialer opens.
func (p *Peer) answer(parent context.Context, s Signal) {
	if s.To != p.cfg.Name {
		return
	}
	if err := s.Verify(p.cfg.Fed); err != nil {
		p.logf("p2p: refused an offer from %s: %v", s.From, err)
		return
	}
	remote, _ := p.cfg.Fed.Member(s.From)
	ctx, cancel := context.WithTimeout(parent, p.cfg.ConnectTimeout)
	defer cancel()
	c := newConn(s.From)
	c.remoteMTU.Store(sdpMTU(s.SDP))
	err := func() error {
		sdp, err := p.answerOffer(ctx, parent, c, client{Member: remote}, s.SDP, false)
		if err != nil {
			return err
		}
		out := Signal{Session: s.Session, From: p.cfg.Name, To: s.From, Kind: KindAnswer, SDP: withMTU(sdp), Fingerprint: p.fp}
		if err := out.sign(p.cfg.Identity); err != nil {
			return err
		}
		if err := p.cfg.Signal.Send(ctx, out); err != nil {
			return err
		}
		return c.waitConnected(ctx)
	}()
	if err != nil {
		c.close()
		p.logf("p2p: answering %s: %v", s.From, err)
		return
	}
	c.describe()
	p.counter(s.From).connected(c.path, c.pair)
	p.track(c)
	p.logf("p2p: %s connected to us, path %s (%s)", s.From, c.path, c.pair)
	// The answering side keeps the connection until the dialer closes it
	// or it fails; it is not reused for this side's own dials (the dialer
	// owns it), which keeps the two sides from racing two connections.
	go func() {
		<-c.gone
		c.close()
	}()
}

// answerOffer makes c's PeerConnection from an offer and returns the
// answer SDP, every candidate gathered; the data channels the remote
// opens are served as remote until serveCtx ends. all ignores the
// peer's relay-only policy (a browser's connection: the node's own
// addresses are public anyway).
func (p *Peer) answerOffer(ctx, serveCtx context.Context, c *conn, remote client, offer string, all bool) (string, error) {
	cfg, err := p.configuration(ctx)
	if err != nil {
		return "", err
	}
	if all {
		cfg.ICETransportPolicy = webrtc.ICETransportPolicyAll
	}
	pc, err := p.api.NewPeerConnection(cfg)
	if err != nil {
		return "", err
	}
	c.setPC(pc)
	pc.OnDataChannel(func(dc *webrtc.DataChannel) {
		dc.OnOpen(func() {
			c.tune(p)
			if dc.Label() == "ctl" {
				return
			}
			rw, err := dc.DetachWithDeadline()
			if err != nil {
				return
			}
			go p.serve(serveCtx, remote, c, newChannel(dc, rw))
		})
	})
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		return "", diag.New(diag.P2PSignalRefused, remote.Name, "the offer is not a usable SDP: %v", err)
	}
	ans, err := pc.CreateAnswer(nil)
	if err != nil {
		return "", err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(ans); err != nil {
		return "", err
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return pc.LocalDescription().SDP, nil
}
