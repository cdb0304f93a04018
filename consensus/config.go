package consensus

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	wal "github.com/hashicorp/raft-wal"

	"github.com/scellis/scellis/diag"
)

// Server is one member of the Raft configuration: its node ID (the member
// name in the federation file) and its Raft address (host:port).
type Server struct {
	ID      string
	Address string
}

// Config configures one node. Zero durations and sizes take the defaults
// listed on each field, which suit a cluster on one LAN or on loopback.
type Config struct {
	// NodeID names this node in the Raft configuration. Required.
	NodeID string
	// BindAddr is the host:port the Raft listener binds. Required unless
	// Listener is set.
	BindAddr string
	// AdvertiseAddr is the host:port other nodes dial to reach this one, as it
	// appears in the Raft configuration. Default: the listener's address.
	AdvertiseAddr string
	// Listener, when set, is used instead of binding BindAddr (tests, socket
	// activation). The node owns it: Close, or a failed Open, closes it.
	Listener net.Listener

	// Dir is the node's data directory: the raft-wal log and stable store in
	// Dir/wal, Raft snapshots in Dir/snapshots. Created when missing.
	Dir string

	// ServerTLS authenticates inbound Raft connections. It must require a
	// client certificate (tls.RequireAnyClientCert with pinning in
	// VerifyPeerCertificate/VerifyConnection, or RequireAndVerifyClientCert);
	// the node clones it and forces TLS 1.3.
	ServerTLS *tls.Config
	// ClientTLS returns the config used to dial the server with the given
	// node ID, so the caller can pin that server's key. Raft dials addresses;
	// the node maps an address to its server ID through the latest Raft
	// configuration (then Bootstrap and AddVoter calls) and refuses to dial an
	// address no server has. A nil result refuses the dial.
	ClientTLS func(serverID string) *tls.Config

	// Bootstrap is the initial configuration of a new cluster, the same list
	// on every founding node. It is used only when the data directory holds no
	// Raft state; it must then name this node at its advertised address. A
	// node that joins a running cluster later leaves it empty and is added
	// with AddVoter on the leader.
	Bootstrap []Server

	// HeartbeatTimeout: a follower that hears nothing from the leader for
	// this long (randomised up to twice as long) starts an election; the
	// leader heartbeats every tenth of it. Default 1s (hashicorp/raft's LAN
	// default: on a busy two-core machine 300 ms let a slow scheduler
	// trigger spontaneous elections). For links of about 150 ms round trip
	// use 3s (the aggregator config's raft_timing: wan).
	HeartbeatTimeout time.Duration
	// ElectionTimeout: how long a candidate waits before a new election.
	// Default 1s; at least HeartbeatTimeout.
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout: a leader that cannot reach a quorum for this long
	// steps down. Default 500ms; at most HeartbeatTimeout.
	LeaderLeaseTimeout time.Duration
	// CommitTimeout: the longest a follower waits to learn a new commit index
	// when no entries flow. Default 10ms.
	CommitTimeout time.Duration
	// IOTimeout bounds dials, TLS handshakes and RPC writes. Default 10s.
	IOTimeout time.Duration

	// SnapshotThreshold is the number of log entries (batches, not
	// commands) after which a snapshot is taken; SnapshotInterval is how often
	// that is checked. Defaults 8192 and 60s.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// TrailingLogs is how many entries stay in the log after a snapshot, so a
	// briefly absent follower catches up from the log rather than from a
	// snapshot. Default 10240.
	TrailingLogs uint64
	// SnapshotRetain is how many snapshots stay on disk. Default 2.
	SnapshotRetain int
	// SegmentSize is the size of one raft-wal segment file. Default 64 MiB.
	// Compaction frees the log a whole segment at a time; until then raft-wal
	// still serves the compacted entries, and a lagging follower is caught up
	// from them rather than from a snapshot.
	SegmentSize int

	// MaxBatchCommands and MaxBatchBytes bound one batch (one log entry).
	// Defaults 1024 commands and 1 MiB; a single larger command travels
	// alone.
	MaxBatchCommands int
	MaxBatchBytes    int
	// MaxInflightBatches is how many batches may be in Raft at once; commands
	// arriving meanwhile queue and form the next batch. Default 2.
	MaxInflightBatches int

	// Logger receives Raft, transport and log-store messages. nil discards
	// them (and skips formatting them).
	Logger io.Writer
	// LogLevel is trace, debug, info, warn, error or off. Default info when
	// Logger is set.
	LogLevel string
	// Slog, when set, receives those messages instead of Logger, at the
	// levels its handler enables (LogLevel is then unused); a start-up
	// election is logged at info, not warn.
	Slog *slog.Logger
}

// withDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatTimeout, time.Second)
	def(&c.ElectionTimeout, time.Second)
	def(&c.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&c.CommitTimeout, 10*time.Millisecond)
	def(&c.IOTimeout, 10*time.Second)
	def(&c.SnapshotInterval, 60*time.Second)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = 2
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = wal.DefaultSegmentSize
	}
	if c.MaxBatchCommands == 0 {
		c.MaxBatchCommands = 1024
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 1 << 20
	}
	if c.MaxInflightBatches == 0 {
		c.MaxInflightBatches = 2
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Logger == nil {
		c.LogLevel = "off"
	}
	return c
}

// validate reports every problem with c at once, as SC8001 diagnostics.
func (c Config) validate() error {
	var l diag.List
	bad := func(subject, help, format string, args ...any) {
		l = append(l, diag.New(diag.ConsensusConfig, subject, format, args...).WithHelp("%s", help))
	}
	if c.NodeID == "" {
		bad("node_id", "set the node ID to this node's member name", "node ID is empty")
	}
	if c.Dir == "" {
		bad("dir", "set a data directory for the Raft log and snapshots", "data directory is empty")
	}
	if c.Listener == nil && c.BindAddr == "" {
		bad("bind_addr", "set the host:port to listen on for Raft traffic", "bind address is empty")
	}
	if c.ServerTLS == nil {
		bad("server_tls", "build it from the node's identity and the federation file", "server TLS config is missing")
	} else if c.ServerTLS.ClientAuth != tls.RequireAnyClientCert && c.ServerTLS.ClientAuth != tls.RequireAndVerifyClientCert {
		bad("server_tls", "set ClientAuth to tls.RequireAnyClientCert and pin the federation's keys",
			"server TLS config does not require client certificates (%v), so an unknown node could connect", c.ServerTLS.ClientAuth)
	}
	if c.ClientTLS == nil {
		bad("client_tls", "give a function returning the client TLS config pinned to a server ID", "client TLS function is missing")
	}
	if c.HeartbeatTimeout < 0 || c.ElectionTimeout < 0 || c.LeaderLeaseTimeout < 0 || c.CommitTimeout < 0 || c.IOTimeout < 0 || c.SnapshotInterval < 0 {
		bad("timeouts", "use positive durations or zero for the default", "a timeout is negative")
	}
	if c.MaxBatchCommands < 0 || c.MaxBatchBytes < 0 || c.MaxInflightBatches < 0 || c.SnapshotRetain < 0 || c.SegmentSize < 0 {
		bad("batching", "use positive sizes or zero for the default", "a batch or snapshot limit is negative")
	}
	if c.LogLevel != "" && hclog.LevelFromString(c.LogLevel) == hclog.NoLevel {
		bad("log_level", "use trace, debug, info, warn, error or off", "unknown log level %q", c.LogLevel)
	}
	ids := map[string]bool{}
	addrs := map[string]bool{}
	self := false
	for _, s := range c.Bootstrap {
		switch {
		case s.ID == "" || s.Address == "":
			bad("bootstrap", "give every server an ID and a host:port", "server %q has an empty ID or address", s.ID)
		case ids[s.ID]:
			bad("bootstrap", "list each server once", "server ID %q listed twice", s.ID)
		case addrs[s.Address]:
			bad("bootstrap", "give each server its own address", "address %s listed twice", s.Address)
		}
		if _, _, err := net.SplitHostPort(s.Address); s.Address != "" && err != nil {
			bad("bootstrap", "write addresses as host:port", "server %q: %v", s.ID, err)
		}
		ids[s.ID], addrs[s.Address] = true, true
		if s.ID == c.NodeID {
			self = true
		}
	}
	if len(c.Bootstrap) > 0 && !self && c.NodeID != "" {
		bad("bootstrap", "list every founding node, this one included, or leave the list empty to join later",
			"bootstrap list does not name this node %q", c.NodeID)
	}
	return l.Err()
}

// checkAdvertised checks, once the listener exists, that the bootstrap list
// names this node at the address it advertises.
func (c Config) checkAdvertised(advertise string) error {
	for _, s := range c.Bootstrap {
		if s.ID == c.NodeID && s.Address != advertise {
			return diag.New(diag.ConsensusConfig, "bootstrap",
				"bootstrap list has this node %q at %s, but it advertises %s", c.NodeID, s.Address, advertise).
				WithHelp("set the advertise address to the one in the federation file")
		}
	}
	return nil
}

// hclogger returns the logger shared by Raft, its transport and stores.
func (c Config) hclogger() hclog.Logger {
	if c.Slog != nil {
		return slogHclog(c.Slog)
	}
	out := c.Logger
	if out == nil {
		out = io.Discard
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:   "raft",
		Output: out,
		Level:  hclog.LevelFromString(c.LogLevel),
	})
}
