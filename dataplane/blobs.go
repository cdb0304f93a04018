package dataplane

import (
	"context"
	"errors"
	"sync"

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
}

func (b *Blobs) used(via, path string, err error) {
	b.mu.Lock()
	changed := b.last != via+" "+path
	b.last = via + " " + path
	if path != PathHTTPS {
		b.cur = via
	}
	b.mu.Unlock()
	if !changed || b.Logf == nil {
		return
	}
	if path == PathHTTPS {
		b.Logf("p2p: blobs with %s go over the https fallback (data channel: %v)", via, err)
	} else {
		b.Logf("p2p: blobs with %s go over a %s data channel", via, path)
	}
}

func (b *Blobs) pathOf(via string) string {
	for _, s := range b.Peer.Stats() {
		if s.Peer == via {
			return s.Path
		}
	}
	return PathDirect
}

// over runs op with Via, then with each of Others while the error is that
// there is no path; it returns the aggregator the last attempt went to.
func (b *Blobs) over(ctx context.Context, op func(via string) error) (string, error) {
	via, err := b.Via, op(b.Via)
	for _, o := range b.Others {
		if err == nil || !errors.Is(err, ErrNoPath) || ctx.Err() != nil {
			break
		}
		via, err = o, op(o)
	}
	return via, err
}

// GetBlob fetches ref (hash-checked on either path).
func (b *Blobs) GetBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	var data []byte
	via, err := b.over(ctx, func(via string) (err error) {
		data, err = b.Peer.Get(ctx, via, ref)
		return err
	})
	if err == nil {
		b.used(via, b.pathOf(via), nil)
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
	via, err := b.over(ctx, func(via string) (err error) {
		ref, err = b.Peer.Put(ctx, via, data)
		return err
	})
	if err == nil {
		b.used(via, b.pathOf(via), nil)
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
	return &Blobs{Peer: peer, Via: via, Others: others, HTTPS: cfg.HTTPS, Logf: cfg.Logf}, nil
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
