package aggregator

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/secagg/transport"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/trust"
)

// The node's end of the peer-to-peer data plane (docs/dataplane.md): a
// signalling mailbox on the mutual-TLS listener (node-local memory, never
// the Raft log: law 3), a data-plane peer that serves and receives the
// node's blobs over WebRTC data channels under the same rules as the
// HTTPS blob endpoint, and optionally a STUN/TURN server.

// DataPlaneStatus is the data-plane part of a node's status: which path
// each peer pair used, with bytes.
type DataPlaneStatus struct {
	Pairs   []dataplane.PairStats `json:"pairs"`
	Mailbox int                   `json:"mailbox_pending"`
	TURN    *dataplane.TURNStats  `json:"turn,omitempty"`
}

// startDataPlane mounts the mailbox on mux and starts the peer (and the
// TURN server, when configured); the peer runs until ctx ends.
func (n *Node) startDataPlane(ctx context.Context, mux *http.ServeMux) error {
	n.p2pBox = &dataplane.Mailbox{}
	if n.opt.TURNListen != "" {
		relayIP := net.ParseIP(n.opt.TURNRelayIP)
		if relayIP == nil {
			host, _, _ := net.SplitHostPort(n.Self.Address)
			relayIP = net.ParseIP(host)
		}
		if relayIP == nil {
			return diag.New(diag.P2PConfig, n.Self.Name, "the TURN relay needs an IP address peers reach it at; %s's address %q has none", n.Self.Name, n.Self.Address).
				WithHelp("set turn_relay_ip in the aggregator config")
		}
		t, err := dataplane.StartTURN(dataplane.TURNConfig{
			Listen: n.opt.TURNListen, RelayIP: relayIP, MaxAllocations: n.opt.TURNMaxAllocations, BandwidthBytes: n.opt.TURNBandwidth,
			MaxPerMember: n.opt.TURNMaxPerMember, AllowPeers: n.opt.TURNAllowPeers,
		})
		if err != nil {
			return err
		}
		n.turn = t
	}
	var ice func(member string) []dataplane.ICEServer
	if n.turn != nil {
		ice = n.turn.Credentials
	}
	var signalling http.Handler = dataplane.Handler(n.fed, n.p2pBox, ice)
	if n.opt.WrapAPI != nil {
		// The recorder of law 3's test sees the signalling too.
		signalling = n.opt.WrapAPI(signalling)
	}
	mux.Handle(dataplane.Prefix, signalling)
	sig, err := dataplane.NewSignalling(n.id, n.fed, n.Self.Name, n.p2pBox)
	if err != nil {
		return err
	}
	peer, err := dataplane.New(dataplane.Config{
		Identity: n.id, Name: n.Self.Name, Fed: n.fed, Signal: sig, Store: nodeStore{n}, Loopback: n.opt.P2PLoopback,
		ICE: func(context.Context) ([]dataplane.ICEServer, error) {
			if ice == nil {
				return nil, nil
			}
			return ice(n.Self.Name), nil
		},
		Authorize: func(m identity.Member, op string, ref content.Ref) error {
			// The same rule as the HTTPS blob endpoint (node.go): any
			// member may upload; reads of undecided results are for
			// the aggregators alone (law 13).
			if op == "get" && !api.BlobReadable(n.fsm.machine().ResultUse(ref), m) {
				return fmt.Errorf("%s may not read this blob: a shard result not yet decided, or of an open-pool job %s did not submit", m.Name, m.Name)
			}
			return nil
		},
		// Secure-aggregation exchanges that come over a data channel go
		// through the same hosts, as the member the channel
		// authenticated (secagg/transport).
		Services: map[string]dataplane.Service{transport.Service: transport.Serve(n.secaggHosts(), wire.Prefix, wire.HEPrefix)},
		Logf:     func(format string, args ...any) { n.log.Info(fmt.Sprintf(format, args...)) },
	})
	if err != nil {
		return err
	}
	n.p2p = peer
	n.metrics.reg.MustRegister(peer.Collector())
	n.done.Add(1)
	go func() {
		defer n.done.Done()
		peer.Run(ctx)
	}()
	return nil
}

// secaggHosts is the node's secure-aggregation host, as the API listener
// mounts it.
func (n *Node) secaggHosts() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(wire.Prefix, n.metrics.countPlane("secagg", n.sagg))
	mux.Handle(wire.HEPrefix, n.metrics.countPlane("secagg", n.sagg))
	return mux
}

func (n *Node) closeDataPlane() {
	if n.p2p != nil {
		n.p2p.Close()
	}
	if n.turn != nil {
		n.turn.Close()
	}
}

func (n *Node) dataPlaneStatus() *DataPlaneStatus {
	if n.p2p == nil {
		return nil
	}
	st := &DataPlaneStatus{Pairs: n.p2p.Stats(), Mailbox: n.p2pBox.Pending()}
	if n.turn != nil {
		ts := n.turn.Stats()
		st.TURN = &ts
	}
	return st
}

// nodeStore is the node's blob store as the data plane serves it: a blob
// uploaded to another aggregator is fetched from there, as for the
// node's own planning (replicate.go).
type nodeStore struct{ n *Node }

func (s nodeStore) Get(ref content.Ref) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.n.fetchBlob(ctx, ref)
}

// Put stores a member's upload over a data channel; on the leader its
// copy to a second node starts at once (earlycopy.go), as for an upload
// over HTTPS.
func (s nodeStore) Put(ref content.Ref, r io.Reader) error {
	if err := s.n.blobs.Put(ref, r); err != nil {
		return err
	}
	if _, _, self := s.n.leader(); self {
		s.n.startEarlyCopy(ref)
	}
	return nil
}

// BrowserDataPlane is the handler that the listener serving volunteers'
// pages mounts for their tabs' blobs (dataplane.BrowserHandler: the
// module, signalling to this node's data-plane peer, and the HTTPS
// fallback at /blobs/). check names the volunteer a request comes from,
// from its session token (dataplane.BearerToken), or refuses it.
func (n *Node) BrowserDataPlane(check func(r *http.Request) (volunteer string, err error)) http.Handler {
	var ice func(member string) []dataplane.ICEServer
	if n.turn != nil {
		ice = n.turn.Credentials
	}
	return n.p2p.BrowserHandler(dataplane.BrowserAuth{Check: check, May: n.browserMay}, n.blobs, ice)
}

// browserMay is what a volunteer's tab may move. It may put any blob:
// a shard result counts only once reported over the control API, and a
// blob is stored only under its own hash. It may get only what a running
// job of the open regime hands its workers — the job's bundle and the
// content and inputs the bundle names, all public by admission — never a
// shard result (law 13) and nothing of a job in another regime.
func (n *Node) browserMay(volunteer, op string, ref content.Ref) error {
	switch op {
	case "put":
		return nil
	case "get":
	default:
		return fmt.Errorf("unknown operation %q", op)
	}
	for _, j := range n.fsm.machine().Jobs() {
		if j.Regime != trust.Open || j.State != coordinator.JobRunning {
			continue
		}
		if j.Bundle == ref {
			return nil
		}
		raw, err := n.blobs.Get(j.Bundle)
		if err != nil {
			continue
		}
		var b job.Bundle
		if content.Decode(raw, &b) != nil {
			continue
		}
		if b.Program == ref || b.Partitioner.Ref == ref || b.Reducer.Ref == ref {
			return nil
		}
		for _, r := range b.Content {
			if r == ref {
				return nil
			}
		}
		for _, in := range b.Inputs {
			if in.Ref == ref {
				return nil
			}
		}
	}
	return fmt.Errorf("volunteer %s may not read %s: a browser reads only the bundles, content and inputs of running open-pool jobs", volunteer, ref.Short())
}
