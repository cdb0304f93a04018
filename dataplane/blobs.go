package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// HTTPSBlobs is the last fallback: the aggregators' HTTPS blob endpoint
// (*api.Client).
type HTTPSBlobs interface {
	GetBlob(ctx context.Context, ref content.Ref) ([]byte, error)
	PutBlob(ctx context.Context, b []byte) (content.Ref, error)
}

// Blobs moves a member's blobs to and from the pool: over a data channel
// to the aggregator Via — or, when there is no path to it, to the first of
// Others that has one — else over HTTPS. It is what a worker or silo uses
// in place of the API client's blob calls; each change of path is logged
// once, so the log says which path the member's blobs take.
//
// A transfer never waits for a connection to be made: it takes a data
// channel that is up now, or goes over HTTPS at once. The connections are
// made in the background (keep), from the start, and after a failure
// again with backoff — never in the path of a lease or a report, which a
// blob transfer is (a worker fetches a shard's inputs under its lease and
// uploads the result before it reports).
type Blobs struct {
	Peer *Peer
	Via  string // the aggregator member to move blobs with
	// Others are the aggregators to move blobs with when Via has no data
	// channel path (down, or avoided), in order.
	Others []string
	HTTPS  HTTPSBlobs
	Logf   func(format string, args ...any)

	mu   sync.Mutex
	last string // the path and aggregator of the last transfer, for logging changes
	cur  string // the aggregator the last data-channel transfer went to
	// why no data channel is up, once the first round of attempts ended;
	// nil before (errSettingUp) and while one is up.
	why     error
	settled bool

	once   sync.Once
	wake   chan struct{} // a transfer happened: demand for a channel
	up     chan struct{} // closed when a first channel is up
	upOnce sync.Once
}

// Connected is closed once a first data channel is up (never, if none
// ever comes up). Blobs never wait for it; a caller that wants its blobs
// to take the data channel from the first one (a test) may.
func (b *Blobs) Connected() <-chan struct{} {
	b.start(context.Background())
	return b.up
}

// errSettingUp: the first connection attempts have not ended yet.
var errSettingUp = fmt.Errorf("%w: the data channel is being set up", ErrNoPath)

func (b *Blobs) used(via, path string, err error) {
	key := via + " " + path
	if path == PathHTTPS && errors.Is(err, errSettingUp) {
		key += " setup"
	}
	b.mu.Lock()
	changed := b.last != key
	b.last = key
	if path != PathHTTPS {
		b.cur = via
	}
	b.mu.Unlock()
	if !changed || b.Logf == nil {
		return
	}
	switch {
	case path != PathHTTPS:
		b.Logf("p2p: blobs with %s go over a %s data channel", via, path)
	case errors.Is(err, errSettingUp):
		b.Logf("p2p: blobs with %s go over https while the data channel is set up (candidates: %s)", via, b.Peer.Scope())
	default:
		b.Logf("p2p: blobs with %s go over the https fallback (data channel: %v)", via, err)
	}
}

// order is the aggregators in order of preference.
func (b *Blobs) order() []string { return append([]string{b.Via}, b.Others...) }

// start starts keep once; ctx ends it (StartMember's), else the peer's
// Close does.
func (b *Blobs) start(ctx context.Context) {
	b.once.Do(func() {
		b.wake, b.up = make(chan struct{}, 1), make(chan struct{})
		ctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-b.Peer.done:
			case <-ctx.Done():
			}
			cancel()
		}()
		go b.keep(ctx)
	})
}

// demand tells keep that blobs are moving.
func (b *Blobs) demand() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// keep holds a data channel up with the first aggregator in order that
// takes one, in the background. It dials in order until one connects;
// then waits for that connection to go (and dials again at once: it was
// working), or for an aggregator earlier in the order to be due for
// another attempt — made only once blobs are moving again, so an idle
// member does not keep dialling one that refuses it. The first round
// runs at start, so that the first blobs find a channel up.
func (b *Blobs) keep(ctx context.Context) {
	order := b.order()
	for ctx.Err() == nil {
		// This round answers the demand so far; blobs moving during it
		// are demand for the next.
		select {
		case <-b.wake:
		default:
		}
		// Dial the aggregators preferred to the one in use (all, when
		// none is), in order, until one connects.
		preferred := len(order)
		for i, m := range order {
			if b.Peer.liveConn(m) != nil {
				preferred = i
				break
			}
		}
		var why error
		for i, m := range order[:preferred] {
			if time.Now().Before(b.Peer.retryAt(m)) {
				continue
			}
			c, err := b.Peer.connect(ctx, m, true)
			if err == nil {
				b.used(m, c.path, nil)
				b.upOnce.Do(func() { close(b.up) })
				preferred = i
				break
			}
			why = err
		}
		if ctx.Err() != nil {
			return
		}
		var gone <-chan struct{}
		if preferred < len(order) {
			c := b.Peer.liveConn(order[preferred])
			if c == nil {
				continue // it went already: another round
			}
			gone = c.gone
		}
		b.mu.Lock()
		first := !b.settled
		b.settled, b.why = true, nil
		if gone == nil {
			b.why = cmpOr(why, error(fmt.Errorf("%w: every aggregator's last attempt failed; retrying with backoff", ErrNoPath)))
		}
		b.mu.Unlock()
		if gone == nil && (why != nil || first) {
			b.used(b.Via, PathHTTPS, b.noChannel())
		}
		if !b.wait(ctx, gone, order[:preferred]) {
			continue // it was working: dial again at once
		}
		// Due: once blobs move again (or the channel in use goes).
		select {
		case <-ctx.Done():
			return
		case <-gone:
		case <-b.wake:
		}
	}
}

// wait waits for the next attempt due among the aggregators preferred
// to the one in use (never sooner than RetryMin: no busy loop); it
// reports false if the connection in use (gone) went first.
func (b *Blobs) wait(ctx context.Context, gone <-chan struct{}, preferred []string) bool {
	if len(preferred) == 0 {
		select {
		case <-ctx.Done():
		case <-gone:
			return false
		}
		return true
	}
	next := b.Peer.retryAt(preferred[0])
	for _, m := range preferred[1:] {
		if at := b.Peer.retryAt(m); at.Before(next) {
			next = at
		}
	}
	t := time.NewTimer(max(time.Until(next), b.Peer.cfg.RetryMin))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-gone:
		return false
	case <-t.C:
	}
	return true
}

// noChannel is why a transfer finds no data channel up.
func (b *Blobs) noChannel() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.settled {
		return errSettingUp
	}
	if b.why != nil {
		return b.why
	}
	return fmt.Errorf("%w: the connection broke; redialling in the background", ErrNoPath)
}

// over runs op on the first aggregator in order with a data channel up
// now; it returns the aggregator and path, or ErrNoPath at once when
// none is up.
func (b *Blobs) over(ctx context.Context, op func(c *conn) error) (via, path string, err error) {
	b.start(context.Background()) // StartMember started it with its own
	b.demand()
	for _, m := range b.order() {
		c := b.Peer.liveConn(m)
		if c == nil {
			continue
		}
		err := op(c)
		if err == nil {
			return m, c.path, nil
		}
		if !errors.Is(err, ErrNoPath) || ctx.Err() != nil {
			return m, "", err // the transfer failed: this blob goes over https
		}
		// The connection closed under the transfer: the next one up.
	}
	return b.Via, "", b.noChannel()
}

// GetBlob fetches ref (hash-checked on either path).
func (b *Blobs) GetBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	var data []byte
	via, path, err := b.over(ctx, func(c *conn) (err error) {
		data, err = b.Peer.getOn(ctx, c, ref)
		return err
	})
	if err == nil {
		b.used(via, path, nil)
		return data, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	b.used(b.Via, PathHTTPS, err)
	data, herr := b.HTTPS.GetBlob(ctx, ref)
	if herr == nil {
		b.Peer.RecordHTTPS(b.Via, int64(len(data)))
	}
	return data, herr
}

// PutBlob stores data in the pool and returns its ref.
func (b *Blobs) PutBlob(ctx context.Context, data []byte) (content.Ref, error) {
	var ref content.Ref
	via, path, err := b.over(ctx, func(c *conn) (err error) {
		ref, err = b.Peer.putOn(ctx, c, data)
		return err
	})
	if err == nil {
		b.used(via, path, nil)
		return ref, nil
	}
	if ctx.Err() != nil {
		return ref, ctx.Err()
	}
	b.used(b.Via, PathHTTPS, err)
	ref, herr := b.HTTPS.PutBlob(ctx, data)
	if herr == nil {
		b.Peer.RecordHTTPS(b.Via, int64(len(data)))
	}
	return ref, herr
}

// NotDurable says that bytes put over a data channel were not found on a
// majority of aggregators when the pool looked for them: the aggregator
// they went to is cut off from the others (or died after the upload). It
// is avoided for the Peer's RetryAfter window: blobs go to the next of
// Others, or over HTTPS to whichever aggregators answer.
func (b *Blobs) NotDurable() {
	b.mu.Lock()
	via := cmpOr(b.cur, b.Via)
	b.mu.Unlock()
	b.Peer.Avoid(via)
	b.used(via, PathHTTPS, errors.New("the pool could not find a result put over the data channel on a majority"))
}

// MemberConfig sets up the data plane of a member that is not an
// aggregator (a worker or a silo).
type MemberConfig struct {
	Identity *identity.Identity
	Fed      *identity.Federation
	Name     string
	Policy   string   // PolicyAll or PolicyRelay
	Via      string   // the aggregator to move blobs with; "" the member's Home
	STUN     []string // extra STUN/TURN URLs besides the aggregator's
	// Loopback forces loopback-only candidates (Config.Loopback):
	// deprecated, implied by a federation on loopback addresses.
	Loopback bool
	HTTPS    HTTPSBlobs
	Logf     func(format string, args ...any)
}

// StartMember starts a member's data-plane peer, running until ctx ends,
// and returns its blob mover.
func StartMember(ctx context.Context, cfg MemberConfig) (*Blobs, error) {
	peer, via, err := NewMember(cfg)
	if err != nil {
		return nil, err
	}
	go func() {
		peer.Run(ctx)
		peer.Close()
	}()
	var others []string
	for _, a := range cfg.Fed.ByRole(identity.Aggregator) {
		if a.Name != via {
			others = append(others, a.Name)
		}
	}
	b := &Blobs{Peer: peer, Via: via, Others: others, HTTPS: cfg.HTTPS, Logf: cfg.Logf}
	// The data channel is set up now, in the background, so that the
	// first blobs find it up; until it is, they go over HTTPS.
	b.start(ctx)
	return b, nil
}

// NewMember returns a member's data-plane peer (not yet running) and the
// aggregator it moves blobs with.
func NewMember(cfg MemberConfig) (*Peer, string, error) {
	via := cfg.Via
	if via == "" {
		h, ok := Home(cfg.Fed, cfg.Name)
		if !ok {
			return nil, "", diag.New(diag.P2PConfig, cfg.Name, "the federation has no aggregator to move blobs with")
		}
		via = h.Name
	}
	if m, ok := cfg.Fed.Member(via); !ok || m.Role != identity.Aggregator {
		return nil, "", diag.New(diag.P2PConfig, "p2p_via", "%q is not an aggregator of the federation", via).
			WithHelp("name an aggregator member, or leave p2p_via out")
	}
	sig, err := NewSignalling(cfg.Identity, cfg.Fed, cfg.Name, nil)
	if err != nil {
		return nil, "", err
	}
	extra := ICEServer{URLs: cfg.STUN}
	peer, err := New(Config{
		Identity: cfg.Identity, Name: cfg.Name, Fed: cfg.Fed, Signal: sig, Policy: cfg.Policy, Loopback: cfg.Loopback, Logf: cfg.Logf,
		ICE: func(ctx context.Context) ([]ICEServer, error) {
			servers, err := sig.ICE(ctx)
			if err != nil {
				// The aggregator's STUN/TURN is unknown: host and the
				// configured servers' candidates may still do.
				servers = nil
			}
			if len(extra.URLs) > 0 {
				servers = append(servers, extra)
			}
			return servers, nil
		},
	})
	return peer, via, err
}
