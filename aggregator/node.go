package aggregator

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/obs"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify/spot"
)

// Node is one running aggregator.
type Node struct {
	Self identity.Member

	api *api.Server // the control plane this node serves

	id      *identity.Identity
	fed     *identity.Federation
	raft    *consensus.Node
	fsm     *fsm
	hub     *api.Hub
	blobs   *blob.Store
	planner *planner
	log     *slog.Logger
	http    *http.Server
	health  *http.Server // /healthz and /readyz, when health_listen is set
	// metricsSrv serves /metrics when metrics_listen is set and differs
	// from health_listen (else the health server serves it too).
	metricsSrv *obs.Server
	metrics    *nodeMetrics
	logSum     *obs.Summariser
	// studioAddr and studioStop: the Studio, when studio_listen is set.
	studioAddr        net.Addr
	studioFingerprint string
	studioStop        func()
	// volunteerAddr and volunteerStop: the volunteer page, when
	// volunteer_listen is set (volunteer.go).
	volunteerAddr        net.Addr
	volunteerFingerprint string
	volunteerStop        func()
	ln                   net.Listener

	cancel context.CancelFunc
	done   sync.WaitGroup
	early  earlyCopies // members' uploads on their way to a second node (earlycopy.go)
	// shadows are the sums of masked inputs forwarded here for the
	// rounds this node checks (crosscheck_forward.go).
	shadows shadowSums

	reducing sync.Map // job ID → struct{}: a reduction in progress
	// verifying: "job/shard/reports" → struct{}: a verdict in progress (verifier.go)
	verifying sync.Map

	opt        Options
	sagg       *wire.Host // the reducer peer's secure aggregation host (masking and threshold-he)
	activeRuns sync.Map   // run ID → struct{}: a round being planned, hosted or reduced here
	runCache   sync.Map   // run ID → *runCtx
	// seen: silo → time.Time of its last lease poll (zero: gone); see
	// liveness.go. leaderSince: when this node's tenure began (unix ns).
	seen        sync.Map
	leaderSince atomic.Int64
	peerGone    signal // fired when a silo's held poll ends with its connection
	// ingress: whether the other aggregators can reach this leader
	// (ingress.go).
	ingress ingress

	// peerClient talks to the other aggregators as this node (blob
	// replication and fetches).
	peerClient *api.Client
	// ready: whether this node's replica has caught up and may answer
	// reads (catchup.go).
	ready catchUp

	// The data plane (dataplane.go): signalling mailbox, data-channel
	// peer, optional STUN/TURN server.
	p2pBox *dataplane.Mailbox
	p2p    *dataplane.Peer
	turn   *dataplane.TURN
	// conns are the API server's connections (membership.go); rekey
	// serialises loading a rotated key.
	conns conns
	rekey sync.Mutex
}

// Options tune a node; the zero value is production.
type Options struct {
	// Join: do not bootstrap; wait to be added to a running cluster.
	Join bool
	// Raft tuning (0: the consensus defaults).
	SnapshotThreshold, TrailingLogs, SegmentBytes int
	SnapshotInterval                              time.Duration
	// Listen and RaftListen are the addresses the API and Raft listeners
	// bind, when they differ from the federation file's address and
	// raft_address, which stay what the others dial (NAT, containers, a
	// proxy in front). Empty: bind the federation's addresses.
	Listen, RaftListen string
	// HealthListen, if set, serves /healthz and /readyz in plain HTTP on
	// this address (health.go).
	HealthListen string
	// MetricsListen, if set, serves the node's Prometheus series at
	// /metrics in plain HTTP on this address; when it equals HealthListen
	// one listener serves all three paths (metrics.go).
	MetricsListen string
	// StudioListen, if set, serves the Studio, the live web view (package
	// studio), over TLS on this address.
	StudioListen string
	// VolunteerListen, if set, serves the volunteer page (package
	// volunteer) over TLS on this address; VolunteerWasm is the path of
	// the operator's scellis.wasm build (wasm_exec.js beside it) and
	// VolunteerDifficulty the join proof of work in bits (0: the default);
	// VolunteerMaxLeases the live leases one volunteer may hold at once
	// (0: coordinator.DefaultVolunteerLeases).
	VolunteerListen     string
	VolunteerWasm       string
	VolunteerDifficulty int
	VolunteerMaxLeases  int
	// Raft timeouts (0: the consensus defaults, the LAN profile).
	RaftHeartbeat, RaftElection, RaftLeaderLease time.Duration

	LeaseTTL time.Duration
	// Content caps the submitters' content this node runs (partition,
	// cost, reduce): steps, memory, wall-clock time, prices, and how many
	// plans run at once. Zero fields: DefaultContentCaps.
	Content  ContentCaps
	Log      io.Writer // operational log; nil: stderr
	LogLevel string
	// LogFormat is text (default) or json.
	LogFormat string
	// WrapAPI, if set, wraps the control-plane handler (the /v1/ routes
	// and the data plane's signalling under /p2p/, not the blob
	// endpoint). It is a test and observability hook: tests use it to
	// record every control-plane request and response and prove that no
	// result bytes pass through the coordinator API (law 3).
	// Production leaves it nil.
	WrapAPI func(http.Handler) http.Handler

	// Training rounds (zero: production values). SecAgg are the phase
	// deadlines of the secure aggregation rounds this node hosts (the
	// advertise phase must cover the silos' local training), SecAggLongPoll
	// the host's long poll. RoundLeaseTTL is a round shard's lease
	// (default 1 h). ReportGrace is how long, once a round's sum is ready,
	// the leader waits for the contributors to report their contribution
	// hashes before it flags the rest as dropped out (default 2 min).
	SecAgg         wire.Deadlines
	SecAggLongPoll time.Duration
	RoundLeaseTTL  time.Duration
	ReportGrace    time.Duration
	// SiloLease: a silo whose last lease poll is older is left out of the
	// next round and excused from the current one (default 6 s; silos
	// poll every 2 s). RoundAttempts: failed attempts of one round after
	// which its run is paused (default 5). RetryBackoff: the wait before
	// the second attempt, doubled for each later one, at most a minute
	// (default 1 s).
	SiloLease     time.Duration
	RoundAttempts int
	RetryBackoff  time.Duration

	// BodyTimeout bounds reading a request body (see deadlines.go); zero
	// means DefaultBodyTimeout. Tests shorten it.
	BodyTimeout time.Duration

	// The data plane (dataplane.go, docs/dataplane.md). TURNListen, if
	// set, runs a STUN/TURN server on that UDP address; peers reach its
	// relays at TURNRelayIP (default: the host of the node's federation
	// address). TURNMaxAllocations bounds the relays open at once
	// (default 64), TURNMaxPerMember those one member holds (default 4),
	// TURNBandwidth each relay's bytes per second and direction (0: the
	// default, dataplane.DefaultTURNBandwidth); relays reach public
	// unicast addresses and TURNAllowPeers only. P2PLoopback makes ICE use loopback
	// addresses only; deprecated: a federation whose member addresses
	// are all loopback implies it (dataplane/scope.go).
	TURNListen, TURNRelayIP string
	TURNMaxAllocations      int
	TURNBandwidth           int64
	TURNMaxPerMember        int
	TURNAllowPeers          []netip.Prefix
	P2PLoopback             bool

	// NoCommitReveal runs the coordinator without commit–reveal: results
	// are reported outright, which lets a member copy another's hash.
	// Only benchmarks set it, to measure what commit–reveal costs.
	NoCommitReveal bool

	// Delegate, when set, makes this node's cluster a child cluster in a
	// tree of clusters: while it leads, it runs the delegate loop
	// (delegate.go) toward the parent cluster.
	Delegate *Delegate

	// ReloadIdentity loads the node's identity file again; a node whose
	// key an operator rotated calls it to pick up the new key without a
	// restart (membership.go). Nil: a rotated node must be restarted.
	ReloadIdentity func() (*identity.Identity, error)
}

// Start opens the node's stores, joins (or bootstraps) the Raft cluster
// of the federation's aggregators and serves the API and blob endpoint.
func Start(name string, id *identity.Identity, fed *identity.Federation, dataDir string, opt Options) (*Node, error) {
	self, ok := fed.Member(name)
	if !ok || self.Role != identity.Aggregator {
		return nil, diag.New(diag.WorkerConfig, name, "%q is not an aggregator in %s", name, fed.File).
			WithHelp("name an aggregator member of the federation file")
	}
	if !self.PublicKey.Equal(id.Public()) {
		return nil, diag.New(diag.WorkerConfig, name, "the identity key is not %s's key in the federation file", name).
			WithHelp("use the key whose public half is listed for %s", name)
	}
	if self.RaftAddress == "" {
		return nil, diag.New(diag.WorkerConfig, name, "aggregator %s has no raft_address in %s", name, fed.File).
			At(self.Pos.File, self.Pos.Line, self.Pos.Col).
			WithHelp("give each aggregator a raft_address (host:port) for replication")
	}
	logOut := opt.Log
	if logOut == nil {
		logOut = os.Stderr
	}
	level := opt.LogLevel
	if _, err := obs.ParseLevel(level); err != nil {
		level = "warn" // the consensus config refuses it below (SC8001)
	}
	baseLog, logSum, err := obs.NewLogger(logOut, obs.LogConfig{Format: opt.LogFormat, Level: level})
	if err != nil {
		return nil, diag.New(diag.WorkerConfig, "log_format", "%v", err).WithHelp("use log_format: text or log_format: json")
	}
	log := baseLog.With("node", name)

	ttl := opt.LeaseTTL
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	machine, err := coordinator.New(coordinator.Config{Regime: fed.Regime, DefaultLeaseTTL: ttl.Milliseconds(), CommitReveal: !opt.NoCommitReveal, SignedReports: true})
	if err != nil {
		return nil, err
	}
	blobs, err := blob.Open(filepath.Join(dataDir, "blobs"), 0)
	if err != nil {
		return nil, err
	}
	builtin, err := catalog.Builtin()
	if err != nil {
		return nil, err
	}
	n := &Node{
		Self: self, id: id, fed: fed, log: log, logSum: logSum, blobs: blobs, hub: api.NewHub(), opt: opt,
		planner: newPlanner(blobs, filepath.Join(dataDir, "blobs"), builtin, filepath.Join(dataDir, "plans"), opt.Content),
	}
	n.planner.open = fed.Regime == trust.Open
	n.fsm = &fsm{m: machine, hub: n.hub, members: n.membershipApplied}
	n.ready.kick = make(chan struct{}, 1)
	n.metrics = newNodeMetrics(n)
	n.sagg = wire.NewHost(fed, wire.HostOptions{LongPoll: opt.SecAggLongPoll, OnPhase: n.metrics.phase})
	n.planner.fetchBlob = n.fetchBlob
	n.planner.durable = n.durable
	if n.peerClient, err = api.NewClient(id, fed); err != nil {
		return nil, err
	}

	if err := n.openRaft(name, dataDir); err != nil {
		return nil, err
	}

	apiTLS, err := identity.ServerTLSConfig(id, fed)
	if err != nil {
		n.raft.Close()
		return nil, err
	}
	listen := cmp.Or(opt.Listen, self.Address)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		n.raft.Close()
		return nil, diag.New(diag.WorkerConfig, name, "cannot listen on %s: %v", listen, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	n.ln = tls.NewListener(ln, apiTLS)
	srv := &api.Server{
		Fed: fed, Apply: n, Read: readerOf{n.fsm}, Plan: n.planner, Events: n.hub,
		Status: func() any { return n.Status() }, Log: log, Durable: n.durable, DurableAll: n.durableAll, Membership: n, Leader: n.leader,
		Runs: n, Fresh: n.readInfo, Linearize: n.raft.Barrier, Seen: n.sawPeer, Gone: n.lostPeer, MaxHold: n.siloLease() / 2,
		Changes: n.changes, Voters: n.voters, Reach: n.reach, Model: n.exportModel,
	}
	n.api = srv
	var control http.Handler = srv.Handler()
	if opt.WrapAPI != nil {
		control = opt.WrapAPI(control)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", control)
	// The data plane of training rounds: silos' masked inputs go to the
	// reducer peer here, never through the control-plane API (law 3).
	mux.Handle(wire.Prefix, n.metrics.countPlane("secagg", n.sagg))
	mux.Handle(wire.HEPrefix, n.metrics.countPlane("secagg", n.sagg))
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.early.life = cancel, ctx
	if err := n.startDataPlane(ctx, mux); err != nil {
		cancel()
		n.closeDataPlane()
		n.raft.Close()
		ln.Close()
		return nil, err
	}
	mux.Handle("/blobs/", n.metrics.countPlane("blobs", n.copyEarly(blob.Handler(blobs, n.mayReadBlob))))
	mux.HandleFunc("POST "+crossCheckPath, n.serveCrossCheck)
	mux.HandleFunc("POST "+crossCheckMaskedPath, n.serveForwarded)
	bodyTimeout := opt.BodyTimeout
	if bodyTimeout <= 0 {
		bodyTimeout = DefaultBodyTimeout
	}
	n.http = &http.Server{
		Handler:           withDeadlines(mux, bodyTimeout, opt.SecAggLongPoll),
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		ConnState:         n.conns.track(fed),
		ErrorLog:          obs.HTTPErrorLog(log),
	}
	n.startLoops(ctx)
	if err := n.startObservers(opt.HealthListen, opt.MetricsListen); err != nil {
		n.Close()
		return nil, err
	}
	if opt.StudioListen != "" {
		if err := n.startStudio(opt.StudioListen); err != nil {
			n.Close()
			return nil, err
		}
	}
	if opt.VolunteerListen != "" {
		if err := n.startVolunteer(opt.VolunteerListen); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// openRaft opens the node's replica of the coordinator's log: the Raft
// cluster of the federation's aggregators, over mutual TLS between them,
// bootstrapped with all of them unless the node joins an existing one.
func (n *Node) openRaft(name, dataDir string) error {
	id, fed, self, opt, log := n.id, n.fed, n.Self, n.opt, n.log
	raftTLS, err := identity.ServerTLSConfig(id, fed, identity.Aggregator)
	if err != nil {
		return err
	}
	var boot []consensus.Server
	for _, m := range fed.ByRole(identity.Aggregator) {
		if m.RaftAddress != "" && !opt.Join {
			boot = append(boot, consensus.Server{ID: m.Name, Address: m.RaftAddress})
		}
	}
	n.raft, err = consensus.Open(consensus.Config{
		NodeID:        name,
		BindAddr:      cmp.Or(opt.RaftListen, self.RaftAddress),
		AdvertiseAddr: self.RaftAddress,
		Dir:           filepath.Join(dataDir, "raft"),
		ServerTLS:     raftTLS,
		ClientTLS: func(serverID string) *tls.Config {
			c, err := identity.ClientTLSConfig(id, fed, serverID, identity.Aggregator)
			if err != nil {
				return nil
			}
			return c
		},
		Bootstrap:          boot,
		Slog:               log,
		LogLevel:           opt.LogLevel, // validated there (SC8001)
		SnapshotThreshold:  uint64(opt.SnapshotThreshold),
		TrailingLogs:       uint64(opt.TrailingLogs),
		SnapshotInterval:   opt.SnapshotInterval,
		SegmentSize:        opt.SegmentBytes,
		HeartbeatTimeout:   opt.RaftHeartbeat,
		ElectionTimeout:    opt.RaftElection,
		LeaderLeaseTimeout: opt.RaftLeaderLease,
	}, n.fsm)
	return err
}

// mayReadBlob lets a federation member read or write the blob endpoint,
// and refuses it (answered here) a blob it may not read.
func (n *Node) mayReadBlob(w http.ResponseWriter, r *http.Request) bool {
	fed := n.fed
	m, ok := fed.PeerFromRequest(r)
	if !ok {
		http.Error(w, "not a federation member", http.StatusUnauthorized)
		return false
	}
	// Result bytes of an undecided shard are for the aggregators only
	// (law 13); decided ones for the members the job's regime allows.
	if r.Method == http.MethodGet {
		if ref, err := content.ParseRef(r.PathValue("ref")); err == nil && !api.BlobReadable(n.fsm.machine().ResultUse(ref), m) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			diag.RenderJSON(w, diag.List{diag.New(diag.PoolForbidden, ref.Short(), "%s may not read this blob: it is a shard result not yet decided, or of an open-pool job %s did not submit", m.Name, m.Name).
				WithHelp("results are readable once their shard is decided; in an open pool by the job's submitter and operators only")})
			return false
		}
	}
	return true
}

// startLoops starts the node's goroutines: the API server, the leader's
// duties, catching up from peers and, in a child cluster, the heartbeat
// to its parent.
func (n *Node) startLoops(ctx context.Context) {
	log := n.log
	n.done.Add(3)
	go func() {
		defer n.done.Done()
		if err := n.http.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api server", "err", err)
		}
	}()
	go func() {
		defer n.done.Done()
		n.leaderDuties(ctx)
	}()
	go func() {
		defer n.done.Done()
		n.catchUpLoop(ctx)
	}()
	if n.opt.Delegate != nil {
		n.done.Add(1)
		go func() {
			defer n.done.Done()
			n.beat(ctx)
		}()
	}
}

// HandOver, on the leader, transfers leadership to the most up-to-date
// follower before the node stops, so the cluster does not wait out an
// election timeout; it returns the new leader ("" on a follower).
func (n *Node) HandOver(ctx context.Context) (string, error) {
	return n.raft.TransferLeadership(ctx)
}

// Close stops serving and closes the Raft node; the data stays on disk.
func (n *Node) Close() error {
	n.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n.http.Shutdown(ctx)
	if n.health != nil {
		n.health.Shutdown(ctx)
	}
	if n.metricsSrv != nil {
		n.metricsSrv.Close()
	}
	if n.studioStop != nil {
		n.studioStop()
	}
	if n.volunteerStop != nil {
		n.volunteerStop()
	}
	n.sagg.Close()
	n.closeDataPlane()
	err := n.raft.Close()
	n.done.Wait()
	n.planner.close()
	n.logSum.Close()
	return err
}

// Apply implements api.Applier through Raft.
func (n *Node) Apply(ctx context.Context, cmd coordinator.Command) (api.Applied, error) {
	b, err := coordinator.EncodeCommand(cmd)
	if err != nil {
		return api.Applied{}, diag.New(diag.PoolBadCommand, "command", "%v", err)
	}
	began := time.Now()
	apply := n.raft.Apply
	if n.fsm.machine().Bulk(cmd) {
		// A sweep's leases and reports yield to everything else: a
		// training round's steps, submissions, reductions.
		apply = n.raft.ApplyBulk
	}
	out, err := apply(ctx, b)
	if err == nil {
		n.metrics.apply.Observe(time.Since(began).Seconds())
	}
	if err != nil {
		return api.Applied{}, n.leaderErr(err)
	}
	a, err := decodeApplied(out)
	if err != nil {
		return api.Applied{}, fmt.Errorf("aggregator: undecodable outcome: %w", err)
	}
	return a, nil
}

// NodeStatus is what `scellis aggregator status` shows for one node.
type NodeStatus struct {
	Node      string           `json:"node"`
	Raft      consensus.Status `json:"raft"`
	ChainSeq  uint64           `json:"chain_seq"`
	ChainHead content.Ref      `json:"chain_head"`
	StateHash content.Ref      `json:"state_hash"`
	Jobs      int              `json:"jobs"`
	// PlansRunning counts the plans and reductions of submitted content
	// running in child processes on this node now.
	PlansRunning int `json:"plans_running"`
	// DataPlane: the peer-to-peer paths this node used, per peer pair.
	DataPlane *DataPlaneStatus `json:"data_plane,omitempty"`
	// CaughtUp: the node's replica holds what the cluster had committed
	// when it last gained contact with the leader, so it answers reads
	// (catchup.go).
	CaughtUp bool `json:"caught_up"`
	// Polling: the members the node, as leader, counts alive now by their
	// polls (liveness.go: silos, and the workers and child clusters that
	// poll too), sorted; none on a follower, which plans no round.
	Polling []string `json:"polling,omitempty"`
}

// Status reports this node's Raft and state view.
func (n *Node) Status() NodeStatus {
	m := n.fsm.machine()
	seq, head := m.Head()
	return NodeStatus{Node: n.Self.Name, Raft: n.raft.Status(), ChainSeq: seq, ChainHead: head, StateHash: m.StateHash(), Jobs: len(m.Jobs()), PlansRunning: n.planner.Running(), DataPlane: n.dataPlaneStatus(),
		CaughtUp: n.caughtUp(), Polling: n.polling()}
}

// leaderDuties runs on every node but acts only on the leader: it proposes
// clock ticks so expired leases free their shards, and it runs the reducer
// peer for jobs whose shards are all decided.
func (n *Node) leaderDuties(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	// Reduce as soon as a job's last shard is decided, not at the next tick.
	events, cancel := n.hub.Subscribe("")
	defer func() { cancel() }()
	// tenure.ctx lives while this node leads: the rounds it hosts end with it.
	var tenure struct {
		ctx    context.Context
		cancel context.CancelFunc
	}
	stopLeading := func() {
		if tenure.cancel != nil {
			tenure.cancel()
		}
		tenure.ctx, tenure.cancel = nil, nil
	}
	defer stopLeading()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case _, ok := <-events:
			if !ok {
				// Dropped for falling behind: subscribe again, the tick covers the gap.
				events, cancel = n.hub.Subscribe("")
			}
			// One pass serves every event already queued: the duties
			// read the state, not the events, and a batch of reports
			// brings several events per shard.
		drain:
			for {
				select {
				case _, ok := <-events:
					if !ok {
						events, cancel = n.hub.Subscribe("")
						break drain
					}
				default:
					break drain
				}
			}
		}
		// Every node may be the second reducer of a job (reduction.go).
		n.checkReductions(ctx, n.fsm.machine())
		if n.raft.Status().State != consensus.StateLeader {
			stopLeading()
			continue
		}
		if tenure.ctx == nil {
			// A new tenure knows nobody's liveness: what this node heard
			// as a follower, or in an earlier tenure, is stale (every
			// silo gets one lease from now to poll, liveness.go).
			n.seen.Clear()
			n.leaderSince.Store(time.Now().UnixNano())
			tenure.ctx, tenure.cancel = context.WithCancel(ctx)
			n.done.Add(1)
			go func(ctx context.Context) {
				defer n.done.Done()
				n.revokeGone(ctx) // a gone child's pooled shards are leased again at once
			}(tenure.ctx)
			n.done.Add(1)
			go func(ctx context.Context) {
				defer n.done.Done()
				n.watchIngress(ctx) // a leader nobody can reach hands over
			}(tenure.ctx)
			if n.opt.Delegate != nil {
				n.done.Add(1)
				go func(ctx context.Context) {
					defer n.done.Done()
					n.delegateLoop(ctx)
				}(tenure.ctx)
			}
		}
		m := n.fsm.machine()
		now := time.Now().UnixMilli()
		if exp, ok := m.NextExpiry(); ok && exp <= now {
			if _, err := n.Apply(ctx, coordinator.Tick{Now: now}); err != nil {
				n.log.Debug("tick", "err", err)
			}
		}
		n.drawAudits(ctx, m, now)
		n.driveRuns(tenure.ctx, m)
		n.verifyDue(ctx, m)
		// Only decided jobs: this pass runs on every event (JobsIn).
		for _, js := range m.JobsIn(coordinator.JobDecided) {
			// A round job is reduced by its run's round (runs.go).
			// A sub-job is reported to its parent cluster, which reduces
			// the whole job (delegate.go).
			if js.State != coordinator.JobDecided || js.Run != "" || js.Delegated != nil {
				continue
			}
			if _, busy := n.reducing.LoadOrStore(js.ID, struct{}{}); busy {
				continue
			}
			go func(id content.Ref) {
				defer n.reducing.Delete(id)
				ref, err := n.reduceJob(ctx, id)
				if err != nil {
					n.log.Error("reduce", "job", id.Short(), "err", err)
					return
				}
				res, err := n.Apply(ctx, coordinator.ReportReduced{Job: id, Peer: n.Self.Name, Reduced: ref, Now: time.Now().UnixMilli()})
				if err != nil {
					n.log.Warn("report reduced", "job", id.Short(), "err", err)
				} else if len(res.Refusal) > 0 {
					n.log.Warn("report reduced refused", "job", id.Short(), "err", res.Refusal)
				}
			}(js.ID)
		}
	}
}

// readerOf serves queries from the node's current machine (which Restore
// may replace).
type readerOf struct{ f *fsm }

func (r readerOf) Job(id content.Ref) (coordinator.JobStatus, error) { return r.f.machine().Job(id) }
func (r readerOf) HasJob(id content.Ref) error                       { return r.f.machine().HasJob(id) }
func (r readerOf) Jobs() []coordinator.JobStatus                     { return r.f.machine().Jobs() }
func (r readerOf) Receipts(since uint64) []receipt.Receipt           { return r.f.machine().Receipts(since) }
func (r readerOf) Contributions() map[string]int64                   { return r.f.machine().Contributions() }
func (r readerOf) Leasable(peer string, kinds coordinator.Kinds, now int64) int {
	return r.f.machine().LeasableKinds(peer, kinds, now)
}
func (r readerOf) Peers() []coordinator.PeerRecord { return r.f.machine().Peers() }
func (r readerOf) RevealOpen(job content.Ref, shard int, now int64) (bool, int64) {
	return r.f.machine().RevealOpen(job, shard, now)
}
func (r readerOf) ResultUse(ref content.Ref) coordinator.ResultUse {
	return r.f.machine().ResultUse(ref)
}
func (r readerOf) Runs() []coordinator.RunStatus { return r.f.machine().Runs() }
func (r readerOf) Run(id content.Ref) (coordinator.RunStatus, error) {
	return r.f.machine().Run(id)
}

// Join adds a federation aggregator to the Raft voters (leader only).
func (n *Node) Join(ctx context.Context, member string) error {
	m, ok := n.fed.Member(member)
	if !ok || m.Role != identity.Aggregator || m.RaftAddress == "" {
		return diag.New(diag.WorkerConfig, member, "%q is not an aggregator with a raft_address in this node's federation", member).
			WithHelp("add it first (scellis federation add %s --role aggregator --public-key KEY --address HOST:PORT --raft-address HOST:PORT), or list it in every node's federation file", member)
	}
	return n.leaderErr(n.raft.AddVoter(ctx, m.Name, m.RaftAddress))
}

// Leave removes a voter (leader only).
func (n *Node) Leave(ctx context.Context, member string) error {
	return n.leaderErr(n.raft.RemoveServer(ctx, member))
}

// leaderErr maps consensus's not-leader error to the API's redirect.
func (n *Node) leaderErr(err error) error {
	var nl *consensus.NotLeaderError
	if errors.As(err, &nl) {
		e := &api.NotLeaderError{Leader: nl.LeaderID}
		if m, ok := n.fed.Member(nl.LeaderID); ok {
			e.URL = "https://" + m.Address
		}
		return e
	}
	return err
}

// readInfo says how fresh this node's replica is, for the API's reads.
func (n *Node) readInfo() api.ReadInfo {
	info := api.ReadInfo{Node: n.Self.Name, AppliedIndex: n.raft.AppliedIndex(), LeaderContactMs: -1}
	age, ok := n.raft.LeaderContact()
	if ok {
		info.LeaderContactMs = age.Milliseconds()
	}
	info.Stale = !ok || age > n.raft.StaleAfter()
	if !info.Stale && !n.caughtUp() {
		info.Stale, info.CatchingUp = true, true
	}
	return info
}

// leader reports the leader this node knows and its API URL.
func (n *Node) leader() (name, url string, self bool) {
	id, _ := n.raft.Leader()
	if m, ok := n.fed.Member(id); ok {
		url = "https://" + m.Address
	}
	return id, url, id == n.Self.Name
}

// drawAudits proposes the leader's randomness for every shard of an
// adaptive job whose commitment is in the log and waits for its spot-check
// draw (law 10: the choice enters through the log). The seed is drawn from
// crypto/rand here, after the commitment was applied, so nothing a peer
// received before committing depends on it.
func (n *Node) drawAudits(ctx context.Context, m *coordinator.Machine, now int64) {
	pending := m.PendingDraws(now)
	if len(pending) == 0 {
		return
	}
	var b coordinator.Batch
	for _, p := range pending {
		seed := make([]byte, spot.SeedBytes)
		if _, err := rand.Read(seed); err != nil {
			n.log.Error("audit draw", "err", err)
			return
		}
		b.Commands = append(b.Commands, coordinator.DrawAudit{Job: p.Job, Shard: p.Shard, Seed: seed, Now: now})
	}
	if _, err := n.Apply(ctx, b); err != nil {
		n.log.Debug("audit draw", "err", err)
	}
}
