// Package consensus replicates a deterministic state machine across the
// aggregator cluster (1, 3 or 5 nodes) with hashicorp/raft: a raft-wal log
// and stable store and file snapshots on local disk, and a stream layer of
// TLS 1.3 with mutual authentication. Concurrent commands are packed into one
// log entry (group commit) and each caller gets its own response.
//
// The invariant: every node applies the same commands in the same order, so
// state machines that keep the StateMachine contract hold byte-identical
// state; Apply returns a response only for a command committed by a
// majority and applied on the leader.
package consensus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/scellis/scellis/diag"
)

// Node is one member of a Raft cluster. Its methods are safe for concurrent
// use.
type Node struct {
	cfg    Config
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	stream *tlsStream
	store  *wal.WAL
	lock   *os.File
	b      *batcher
	fsm    *fsm
	logs   raft.LogStore // what Raft reads its log through

	// rp is raft for the stream's address resolver, which may run before
	// Open has assigned n.raft.
	rp atomic.Pointer[raft.Raft]
	// known maps addresses to server IDs from Bootstrap and AddVoter, for
	// dials made before the configuration lists a server.
	mu    sync.Mutex
	known map[string]string

	closeOnce sync.Once
	closing   chan struct{} // closed when Close starts: refuse new work
	closed    chan struct{} // closed when Close is done
}

// Open starts a node on cfg with sm as its state machine, which must be in
// its initial state. With an empty data directory and a Bootstrap list, the
// node founds the cluster with that configuration; with an empty directory
// and no list, it waits to be added by the leader (AddVoter); otherwise it
// restores its latest snapshot and log. Configuration problems are reported
// as diag diagnostics (SC8001–SC8003).
func Open(cfg Config, sm StateMachine) (*Node, error) {
	n, err := open(cfg, sm)
	if err != nil && cfg.Listener != nil {
		_ = cfg.Listener.Close()
	}
	return n, err
}

func open(cfg Config, sm StateMachine) (*Node, error) {
	if sm == nil {
		return nil, diag.New(diag.ConsensusConfig, "state machine", "no state machine given")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	logger := cfg.hclogger()

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.Logger = logger
	rc.LogLevel = cfg.LogLevel
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, diag.New(diag.ConsensusConfig, "timeouts", "%v", err).
			WithHelp("the leader lease must not exceed the heartbeat timeout, nor the heartbeat timeout the election timeout")
	}

	walDir := filepath.Join(cfg.Dir, "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, storeErr(cfg.Dir, err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, storeErr(cfg.Dir, err)
	}
	// Since raft-wal v0.4.1 the WAL's Close closes its bolt meta store; a
	// failed Open still leaves it open (and its file locked), so the node
	// owns the meta store for that path only.
	meta := &metadb.BoltMetaDB{}
	store, err := wal.Open(walDir, wal.WithLogger(logger.Named("wal")), wal.WithMetaStore(meta), wal.WithSegmentSize(cfg.SegmentSize))
	if err != nil {
		_ = meta.Close()
		_ = lock.Close()
		return nil, storeErr(walDir, err)
	}
	closeStore := func() {
		_ = store.Close()
		_ = lock.Close()
	}
	// NewFileSnapshotStore keeps its files in <base>/snapshots.
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, cfg.SnapshotRetain, logger.Named("snapshots"))
	if err != nil {
		closeStore()
		return nil, storeErr(filepath.Join(cfg.Dir, "snapshots"), err)
	}

	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.BindAddr); err != nil {
			closeStore()
			return nil, diag.New(diag.ConsensusListen, cfg.BindAddr, "%v", err).
				WithHelp("choose a free port on an address of this machine")
		}
	}
	advertise := cfg.AdvertiseAddr
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	if err := cfg.checkAdvertised(advertise); err != nil {
		_ = ln.Close()
		closeStore()
		return nil, err
	}

	n := &Node{
		cfg:     cfg,
		store:   store,
		lock:    lock,
		known:   map[string]string{},
		closing: make(chan struct{}),
		closed:  make(chan struct{}),
	}
	for _, s := range cfg.Bootstrap {
		n.known[s.Address] = s.ID
	}
	n.stream = newTLSStream(ln, addr(advertise), cfg.ServerTLS, cfg.ClientTLS, n.serverID, cfg.IOTimeout)
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  n.stream,
		MaxPool: 3,
		Timeout: cfg.IOTimeout,
		Logger:  logger.Named("net"),
	})
	fail := func(err error) (*Node, error) {
		_ = n.trans.Close()
		_ = n.stream.Close()
		closeStore()
		return nil, err
	}

	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return fail(storeErr(cfg.Dir, err))
	}
	if !has && len(cfg.Bootstrap) > 0 {
		var c raft.Configuration
		for _, s := range cfg.Bootstrap {
			c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Address)})
		}
		if err := raft.BootstrapCluster(rc, store, store, snaps, n.trans, c); err != nil {
			return fail(storeErr(cfg.Dir, fmt.Errorf("bootstrap: %w", err)))
		}
	}

	if err := checkLog(store); err != nil {
		return fail(damagedLog(walDir, err))
	}

	// Raft reads back every entry it has just written — the leader to
	// replicate it, every node to apply it — and raft-wal serves each read
	// with a pread of its segment: a third of the CPU of a raw entry
	// (issue 19). The cache keeps the last logCacheEntries in memory.
	logs, err := raft.NewLogCache(logCacheEntries, store)
	if err != nil {
		return fail(storeErr(cfg.Dir, err))
	}
	n.fsm, n.logs = &fsm{sm: sm}, logs
	r, err := raft.NewRaft(rc, n.fsm, logs, store, snaps, n.trans)
	if err != nil {
		return fail(storeErr(cfg.Dir, err))
	}
	n.raft = r
	n.rp.Store(r)
	n.b = newBatcher(r, n.mapErr, cfg)
	return n, nil
}

// checkLog reads every entry of the log on disk and decodes each command
// entry's envelope, so that a damaged entry (a disk fault, an edit) stops
// the start with a diagnostic instead of panicking the node in Apply at
// every start. raft-wal checks its checksums only on the tail it
// recovers. The log is bounded by snapshots (TrailingLogs), so the scan
// costs a fraction of a second. An edit that still decodes is not caught
// here: the envelope carries no checksum of its own.
func checkLog(logs raft.LogStore) error {
	first, err := logs.FirstIndex()
	if err != nil {
		return err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return err
	}
	for i := first; first != 0 && i <= last; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return fmt.Errorf("log entry %d cannot be read: %w", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if _, _, err := decodeEntry(l.Data); err != nil {
			return fmt.Errorf("log entry %d is damaged: %w", i, err)
		}
	}
	return nil
}

// damagedLog is the diagnostic of a log checkLog refused, with the
// recovery steps.
func damagedLog(walDir string, err error) error {
	dataDir := filepath.Dir(walDir)
	return diag.New(diag.ConsensusStore, walDir, "%v", err).
		WithHelp("this node's copy of the log is damaged (a disk fault or an edit) and cannot be applied; "+
			"stop the node, move %s aside (keep it to inspect), and start the node again with an empty data directory: "+
			"it catches up from the other nodes of the cluster (a snapshot, then the log). A single-node cluster has no other copy: restore %s from a backup", dataDir, dataDir)
}

// logCacheEntries is how many recent log entries stay in memory for Raft to
// read back: more than one round of replication carries, and at most
// logCacheEntries × MaxBatchBytes (32 MiB with the defaults) held.
const logCacheEntries = 32

func storeErr(path string, err error) error {
	return diag.New(diag.ConsensusStore, path, "%v", err).
		WithHelp("check the directory's permissions; if the log or snapshots are damaged, move the directory away and let the node catch up from the cluster")
}

// addr is the advertised address as given, never resolved through DNS: it
// must equal the address in the Raft configuration.
type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }

// Close stops the node: it refuses new commands, lets the batches in flight
// resolve, shuts Raft down and closes the transport and the log store. The
// data directory keeps the node's state for the next Open. Close is
// idempotent; the state machine is not touched after Close returns.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		close(n.closing)
		drain := 2*n.cfg.HeartbeatTimeout + n.cfg.IOTimeout
		n.b.close(drain)
		// Shutdown waits for Raft's goroutines and closes the transport,
		// unless Raft already shut itself down (a leader that removed
		// itself): then close the transport here.
		if e := n.raft.Shutdown().Error(); e != nil {
			err = e
		}
		_ = n.trans.Close()
		_ = n.stream.Close()
		if e := n.store.Close(); e != nil && err == nil {
			err = e
		}
		_ = n.lock.Close()
		close(n.closed)
	})
	return err
}

// Apply replicates cmd and returns the state machine's response to it, once
// the command is committed and applied on this node, the leader. Concurrent
// calls share log entries. Apply copies cmd.
//
// Errors: a *NotLeaderError (ErrNotLeader) on a follower; ctx's error when
// ctx ends before the command reached Raft (it is not applied);
// ErrOutcomeUnknown (wrapping ctx's error or the Raft error) when it ends
// after — the command may still commit; ErrClosed after Close.
func (n *Node) Apply(ctx context.Context, cmd []byte) ([]byte, error) {
	return n.apply(ctx, cmd, n.b.in)
}

// ApplyBulk is Apply for bulk traffic — a pool's stream of generic
// leases and reports — which yields to every other command: it is
// batched only with bulk commands, after any other command waiting, and
// bulk entries never fill every in-flight slot (batcher). What commits,
// and in which order each caller's commands apply, is as with Apply.
func (n *Node) ApplyBulk(ctx context.Context, cmd []byte) ([]byte, error) {
	return n.apply(ctx, cmd, n.b.bulk)
}

func (n *Node) apply(ctx context.Context, cmd []byte, q chan<- *request) ([]byte, error) {
	if err := n.leaderCheck(); err != nil {
		return nil, err
	}
	req := &request{cmd: append([]byte(nil), cmd...), done: make(chan reply, 1)}
	select {
	case q <- req:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-n.closing:
		return nil, ErrClosed
	}
	select {
	case r := <-req.done:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	case <-n.closed:
		select {
		case r := <-req.done:
			return r.resp, r.err
		default:
			return nil, fmt.Errorf("%w: %w", ErrClosed, ErrOutcomeUnknown)
		}
	}
}

// AddVoter adds a voting server to the cluster; it must run on the leader.
// Before changing the configuration it dials addr and checks the server's
// certificate with ClientTLS(id): a server that cannot be reached, or whose
// key is not the one pinned for id, is refused (ErrPeerRefused, SC8004), so a
// typo or an impostor never becomes a voter that lowers the cluster's fault
// tolerance. Adding a server already in the configuration at addr is a
// no-op.
func (n *Node) AddVoter(ctx context.Context, id, address string) error {
	if err := n.leaderCheck(); err != nil {
		return err
	}
	if id == "" || address == "" {
		return diag.New(diag.ConsensusConfig, "add voter", "server ID and address are required")
	}
	conn, err := n.stream.dial(ctx, address, id, n.cfg.IOTimeout)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPeerRefused, diag.New(diag.ConsensusRefused, id, "%v", err).
			WithHelp("check the member's key and address in the federation file and that the node is running"))
	}
	_ = conn.Close()
	n.mu.Lock()
	n.known[address] = id
	n.mu.Unlock()
	return n.await(ctx, n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(address), 0, enqueueTimeout(ctx)))
}

// RemoveServer removes a server from the cluster; it must run on the leader.
// A leader that removes itself steps down once the change commits; a
// removed node shuts its Raft down (Close it to release its resources).
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if err := n.leaderCheck(); err != nil {
		return err
	}
	return n.await(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, enqueueTimeout(ctx)))
}

// WaitLeader waits until this node knows a leader, and returns it.
func (n *Node) WaitLeader(ctx context.Context) (id, address string, err error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if id, address = n.Leader(); id != "" {
			return id, address, nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-n.closing:
			return "", "", ErrClosed
		}
	}
}

// TransferLeadership hands leadership to the most up-to-date follower
// (Raft's leadership transfer: the follower is caught up, then told to
// start an election at once), so stopping the leader costs the cluster no
// election timeout. It returns the new leader's ID; on a follower it does
// nothing and returns "".
func (n *Node) TransferLeadership(ctx context.Context) (string, error) {
	if n.raft.State() != raft.Leader {
		return "", nil
	}
	if err := n.await(ctx, n.raft.LeadershipTransfer()); err != nil {
		return "", err
	}
	id, err := func() (string, error) {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if id, _ := n.Leader(); id != "" && id != n.cfg.NodeID {
				return id, nil
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
	}()
	return id, err
}

// Barrier waits until every command committed before it is applied on this
// node, the leader. Reads served by the leader after a Barrier see every
// write acknowledged before it.
func (n *Node) Barrier(ctx context.Context) error {
	if err := n.leaderCheck(); err != nil {
		return err
	}
	return n.await(ctx, n.raft.Barrier(enqueueTimeout(ctx)))
}

// Snapshot takes a snapshot now and compacts the log (keeping TrailingLogs
// entries). Having nothing new to snapshot is not an error.
func (n *Node) Snapshot() error {
	select {
	case <-n.closing:
		return ErrClosed
	default:
	}
	err := n.raft.Snapshot().Error()
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil
	}
	return n.mapErr(err)
}

// leaderCheck refuses writes on a follower before they reach Raft.
func (n *Node) leaderCheck() error {
	select {
	case <-n.closing:
		return ErrClosed
	default:
	}
	switch n.raft.State() {
	case raft.Leader:
		return nil
	case raft.Shutdown:
		return fmt.Errorf("%w: raft has shut down (was this node removed from the cluster?)", ErrClosed)
	default:
		return n.notLeader()
	}
}

func (n *Node) notLeader() error {
	id, a := n.Leader()
	if id == n.cfg.NodeID {
		id, a = "", ""
	}
	return &NotLeaderError{LeaderID: id, LeaderAddr: a}
}

// mapErr translates Raft's errors into this package's.
func (n *Node) mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return n.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrClosed, ErrOutcomeUnknown)
	default:
		return fmt.Errorf("consensus: %w", err)
	}
}

// await waits for a Raft future or the end of ctx.
func (n *Node) await(ctx context.Context, f raft.Future) error {
	ch := make(chan error, 1)
	go func() { ch <- f.Error() }()
	select {
	case err := <-ch:
		return n.mapErr(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	}
}

// enqueueTimeout bounds how long Raft may take to accept an operation.
func enqueueTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		if t := time.Until(d); t > 0 {
			return t
		}
		return time.Millisecond
	}
	return 0
}

// serverID maps a Raft address to the server ID that ClientTLS pins: first
// through the latest configuration (committed or not), then through
// Bootstrap and AddVoter.
func (n *Node) serverID(address string) (string, bool) {
	if r := n.rp.Load(); r != nil {
		if f := r.GetConfiguration(); f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				if string(s.Address) == address {
					return string(s.ID), true
				}
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	id, ok := n.known[address]
	return id, ok
}
