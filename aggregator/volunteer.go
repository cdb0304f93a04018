package aggregator

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/obs"
	"github.com/scellis/scellis/studio"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/volunteer"
)

// The volunteer page (package volunteer) is served by a node on its own
// address when volunteer_listen is set, over TLS with the certificate the
// Studio gives browsers. Its work goes through this node: commands
// through Raft (a follower forwards them to the leader: POST /v1/forward), blobs
// through the node's store, replicated to a majority before a report.

type volunteerBackend struct{ n *Node }

var _ volunteer.Backend = volunteerBackend{}

func (b volunteerBackend) Apply(ctx context.Context, cmd coordinator.Command) (api.Applied, error) {
	res, err := b.n.Apply(ctx, cmd)
	var nl *api.NotLeaderError
	if errors.As(err, &nl) && nl.URL != "" && b.n.peerClient != nil {
		// A follower's page: the leader applies the volunteer's command
		// (api.Server.forward), so every node's page works.
		return b.n.peerClient.Forward(ctx, cmd)
	}
	return res, err
}
func (b volunteerBackend) Regime() trust.Regime          { return b.n.fsm.machine().Regime() }
func (b volunteerBackend) Jobs() []coordinator.JobStatus { return b.n.fsm.machine().Jobs() }
func (b volunteerBackend) Job(id content.Ref) (coordinator.JobStatus, error) {
	return b.n.fsm.machine().Job(id)
}
func (b volunteerBackend) RevealOpen(job content.Ref, shard int, now int64) (bool, int64) {
	return b.n.fsm.machine().RevealOpen(job, shard, now)
}
func (b volunteerBackend) Leasable(peer string, now int64) int {
	return b.n.fsm.machine().Leasable(peer, now)
}
func (b volunteerBackend) Blob(ctx context.Context, ref content.Ref) ([]byte, error) {
	return b.n.fetchBlob(ctx, ref)
}
func (b volunteerBackend) PutBlob(ctx context.Context, data []byte) (content.Ref, error) {
	ref, err := b.n.blobs.PutBytes(data)
	if err != nil {
		return "", err
	}
	return ref, b.n.durable(ctx, ref)
}

// startVolunteer serves the volunteer page on addr until the node closes.
func (n *Node) startVolunteer(addr string) error {
	// The page's tabs move blobs with this node's data-plane peer too
	// (docs/dataplane.md, browser peers), under their session tokens.
	var srv *volunteer.Server
	dataPlane := n.BrowserDataPlane(func(r *http.Request) (string, error) { return srv.SessionPeer(r) })
	srv, err := volunteer.New(volunteerBackend{n}, volunteer.Options{
		Wasm: n.opt.VolunteerWasm, Difficulty: n.opt.VolunteerDifficulty, MaxLeases: n.opt.VolunteerMaxLeases,
		CommitReveal: !n.opt.NoCommitReveal, Pool: n.fed.Name, DataPlane: dataPlane,
	}, n.log.With("part", "volunteer"))
	if err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(addr)
	cfg, fp, err := studio.BrowserTLSConfig(n.Self.Name, host)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return diag.New(diag.WorkerConfig, "volunteer_listen", "the volunteer page cannot listen on %s: %v", addr, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	// ReadTimeout bounds reading a request (a result is at most 8 MiB);
	// no WriteTimeout, since a result's answer waits for its reveal.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: obs.HTTPErrorLog(n.log)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(tls.NewListener(ln, cfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("volunteer server", "err", err)
		}
	}()
	n.volunteerAddr, n.volunteerFingerprint = ln.Addr(), fp
	n.volunteerStop = func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		hs.Shutdown(ctx)
		cancel()
		hs.Close()
		<-done
	}
	return nil
}

// VolunteerAddr is the address the volunteer page listens on (nil when
// it is off) and the SHA-256 fingerprint of its certificate.
func (n *Node) VolunteerAddr() (net.Addr, string) { return n.volunteerAddr, n.volunteerFingerprint }
