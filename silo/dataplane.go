package silo

import (
	"context"
	"strings"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/transport"
)

// The silo's end of the peer-to-peer data plane (docs/dataplane.md): with
// Appliance.DataPlane set, round bundles, run specs, models and strategies
// come over a data channel to an aggregator, the silo's contribution
// records go up the same way, and secure-aggregation messages go over a
// data channel to the aggregator hosting the round — each with HTTPS as
// the last fallback. The silo opens no port: it dials out, and the
// aggregator's TURN relay carries the connection when NATs allow nothing
// else.

// blobMover fetches blobs by ref, hash-checked on arrival.
type blobMover interface {
	GetBlob(ctx context.Context, ref content.Ref) ([]byte, error)
}

// blobs is the silo's path for the blobs of a round.
func (a *Appliance) blobs() blobMover {
	if a.DataPlane != nil {
		return a.DataPlane
	}
	return a.Client
}

// roundTransport is the transport of the secure-aggregation exchanges
// with the host at base: a data channel to its aggregator when the silo
// runs the data plane, HTTPS otherwise (and as the fallback). One per
// host, so that its log of path changes is the host's.
func (a *Appliance) roundTransport(base string) transport.Transport {
	https := transport.HTTPS{Client: a.HTTP, Base: base}
	if a.DataPlane == nil {
		return https
	}
	host, ok := a.memberAt(base)
	if !ok {
		return https
	}
	if t, ok := a.transports.Load(host); ok {
		return t.(transport.Transport)
	}
	peer := a.DataPlane.Peer
	t := &transport.DataChannel{
		Peer: peer, Member: host, Fallback: https, FellBack: peer.RecordHTTPS, Moved: a.metrics.countSecAgg,
		PathOf: func(member string) string {
			for _, s := range peer.Stats() {
				if s.Peer == member && s.Path != dataplane.PathHTTPS {
					return s.Path
				}
			}
			return ""
		},
		Path: func(path string, err error) {
			if path == dataplane.PathHTTPS {
				a.logf("p2p: secure aggregation with %s goes over the https fallback (data channel: %v)", host, err)
			} else {
				a.logf("p2p: secure aggregation with %s goes over a %s data channel", host, path)
			}
		},
	}
	got, _ := a.transports.LoadOrStore(host, t)
	return got.(transport.Transport)
}

// memberAt returns the aggregator whose address base ("https://host:port")
// names.
func (a *Appliance) memberAt(base string) (string, bool) {
	addr := strings.TrimSuffix(strings.TrimPrefix(base, "https://"), "/")
	for _, m := range a.Fed.ByRole(identity.Aggregator) {
		if m.Address == addr {
			return m.Name, true
		}
	}
	return "", false
}

// hosts probes one aggregator for the round whose key-set path is path
// (transport.Probe, over HTTPS: a data channel still connecting would
// look like a held poll).
func (a *Appliance) hosts(ctx context.Context, base, path string) bool {
	return transport.Probe(ctx, transport.HTTPS{Client: a.HTTP, Base: base}, path, time.Second)
}

var _ blobMover = (*dataplane.Blobs)(nil)
