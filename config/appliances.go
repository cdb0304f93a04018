package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
)

// Aggregator configures `scellis aggregator`.
type Aggregator struct {
	File           string
	Pos            Positions     `json:"-"`
	Name           string        // this node's member name in the federation file
	Identity       string        // private key file (scellis keygen)
	PassphraseFile string        // for an encrypted key file
	Federation     string        // federation file
	DataDir        string        // Raft log, snapshots, blobs
	LeaseTTL       time.Duration // default lease length for shards
	LogLevel       string        // off, error, warn, info, debug
	// RoundJoinTimeout is how long a training round waits for the cohort's
	// silos to join secure aggregation (advertise) before it goes on without
	// the missing ones as dropouts; silos advertise before they train, and
	// what the join left of this time is theirs to train and charge in
	// (wire.Deadlines.TrainInMask).
	RoundJoinTimeout time.Duration
	// SiloLease: a silo that has not polled for leases for this long is
	// left out of the next round and excused from the current one; so is
	// a child cluster none of whose nodes has beaten (docs/tree.md).
	// RoundAttempts: failed attempts of one round before its run pauses.
	// RoundRetryBackoff: the wait before a failed round's second attempt,
	// doubled for each later one.
	SiloLease         time.Duration
	RoundAttempts     int
	RoundRetryBackoff time.Duration
	// Join: this node joins a running cluster (scellis aggregator join on
	// the leader adds it) instead of bootstrapping one.
	Join bool
	// Raft tuning for operators and tests: log entries between snapshots,
	// entries kept after one, and the log segment size.
	SnapshotThreshold int
	SnapshotInterval  time.Duration
	TrailingLogs      int
	SegmentBytes      int
	// Listen and RaftListen bind the API and Raft listeners when they must
	// differ from the federation file's address and raft_address (NAT,
	// containers, a proxy in front); empty: bind those.
	Listen, RaftListen string
	// HealthListen serves /healthz and /readyz in plain HTTP (empty: off).
	HealthListen string
	// MetricsListen serves /metrics in plain HTTP (empty: off); the same
	// address as health_listen shares its listener.
	MetricsListen string
	LogFormat     string // text (default) or json
	// StudioListen serves the Studio, the live web view, over TLS (empty:
	// off, the default).
	StudioListen string
	// VolunteerListen serves the volunteer page over TLS (empty: off, the
	// default); VolunteerWasm is the operator's scellis.wasm build, with
	// Go's wasm_exec.js beside it; VolunteerDifficulty the join proof of
	// work in bits (0: the default, 18); VolunteerMaxLeases the live
	// leases one volunteer may hold at once (0: the default, 8).
	VolunteerListen     string
	VolunteerWasm       string
	VolunteerDifficulty int
	VolunteerMaxLeases  int
	// Caps on the submitters' content this node runs (partition, cost,
	// reduce) and on the prices it sets; a job's own limits may only lower
	// them. Zero: the aggregator's defaults (aggregator.DefaultContentCaps).
	ContentSteps    int           // Starlark steps per content call
	ContentMemoryMB int           // memory per content call (the child process gets 256 MiB more)
	ContentTimeout  time.Duration // wall clock of one planning or reducing child
	PlanWorkers     int           // plans and reductions at once
	PlansPerMember  int           // one member's submissions planned at once
	PlanCache       int           // compiled plans kept
	MaxShardUnits   int           // work units one shard may cost
	MaxJobUnits     int           // work units one job may cost
	// Raft timing: a profile (lan, the default, or wan for links of about
	// 150 ms round trip) and optional overrides of its three timeouts.
	// After loading, the three fields hold the values in force.
	RaftTiming             string
	RaftHeartbeatTimeout   time.Duration
	RaftElectionTimeout    time.Duration
	RaftLeaderLeaseTimeout time.Duration
	// The data plane (docs/dataplane.md): a STUN/TURN server on
	// TURNListen (UDP; empty: none) whose relays peers reach at
	// TURNRelayIP (default: the host of the node's federation address),
	// at most TURNMaxAllocations relays at once, TURNMaxPerMember per
	// member or volunteer, and TURNBandwidthMB megabytes per second per
	// relay and direction (0: the default, 4). Relays reach public unicast
	// addresses only, and the ranges in TURNAllowPeers (CIDR; e.g.
	// 127.0.0.0/8 for a federation on one machine).
	// P2PLoopback (p2p_loopback): ICE uses loopback addresses only.
	// Deprecated and accepted: implied when every member address in the
	// federation file is loopback (dataplane/scope.go); it matters only
	// for hostnames that resolve to loopback.
	TURNListen         string
	TURNRelayIP        string
	TURNMaxAllocations int
	TURNBandwidthMB    int
	TURNMaxPerMember   int
	TURNAllowPeers     []string
	P2PLoopback        bool
	// A child cluster in a tree of clusters (docs/tree.md): the parent
	// cluster's federation file, the delegate key (the key of this
	// cluster's member entry, role cluster, in that file; every node of
	// the cluster holds it), that member's name, and how many parent
	// shards one sub-job takes (default 50). All three or none.
	ParentFederation string
	DelegateIdentity string
	DelegateName     string
	DelegateBatch    int
}

// RaftTimings are the Raft timeout profiles of an aggregator config:
// heartbeat, election and leader-lease timeouts. lan suits nodes on one
// site or on loopback, even on busy machines (a leader heartbeats every
// tenth of the heartbeat timeout, so a follower calls an election only
// after ten heartbeats went missing); wan suits hospital links of about
// 150 ms round trip, where a 1 s timeout is only six round trips and a
// burst of loss would trigger needless elections.
var RaftTimings = map[string][3]time.Duration{
	"lan": {time.Second, time.Second, 500 * time.Millisecond},
	"wan": {3 * time.Second, 3 * time.Second, 1500 * time.Millisecond},
}

// Liveness defaults: a silo long-polls the leader for leases (its poll,
// the heartbeat) and is counted out when it has been silent for the
// aggregators' silo_lease.
const (
	DefaultSiloPoll  = 2 * time.Second
	DefaultSiloLease = 6 * time.Second
)

// LoadAggregator reads an aggregator config.
func LoadAggregator(file string) (*Aggregator, error) {
	c := &Aggregator{File: file, LeaseTTL: 30 * time.Second, LogLevel: "warn", RoundJoinTimeout: 2 * time.Minute, RaftTiming: "lan",
		SiloLease: DefaultSiloLease, RoundAttempts: 5, RoundRetryBackoff: time.Second}
	fields := []field{
		mk("name", true, "the node's member name in the federation file", str(&c.Name)),
		mk("identity", true, "the private key file made by scellis keygen", str(&c.Identity)),
		mk("passphrase_file", false, "", str(&c.PassphraseFile)),
		mk("federation", true, "the federation file listing every member", str(&c.Federation)),
		mk("data_dir", true, "a folder for the Raft log, snapshots and blobs", str(&c.DataDir)),
		mk("lease_ttl", false, "", duration(&c.LeaseTTL)),
		mk("log_level", false, "", str(&c.LogLevel)),
		mk("log_format", false, "", logFormat(&c.LogFormat)),
		mk("metrics_listen", false, "", str(&c.MetricsListen)),
		mk("join", false, "", boolean(&c.Join)),
		mk("round_join_timeout", false, "", duration(&c.RoundJoinTimeout)),
		mk("silo_lease", false, "", duration(&c.SiloLease)),
		mk("round_attempts", false, "", integer(&c.RoundAttempts, 1, 1000)),
		mk("round_retry_backoff", false, "", duration(&c.RoundRetryBackoff)),
		mk("snapshot_threshold", false, "", integer(&c.SnapshotThreshold, 1, 1<<30)),
		mk("snapshot_interval", false, "", duration(&c.SnapshotInterval)),
		mk("trailing_logs", false, "", integer(&c.TrailingLogs, 1, 1<<30)),
		mk("segment_bytes", false, "", integer(&c.SegmentBytes, 1<<10, 1<<30)),
		mk("listen", false, "", str(&c.Listen)),
		mk("raft_listen", false, "", str(&c.RaftListen)),
		mk("health_listen", false, "", str(&c.HealthListen)),
		mk("studio_listen", false, "", str(&c.StudioListen)),
		mk("volunteer_listen", false, "", str(&c.VolunteerListen)),
		mk("volunteer_wasm", false, "", str(&c.VolunteerWasm)),
		mk("volunteer_difficulty", false, "", integer(&c.VolunteerDifficulty, 1, 32)),
		mk("volunteer_max_leases", false, "", integer(&c.VolunteerMaxLeases, 1, 64)),
		mk("content_steps", false, "", integer(&c.ContentSteps, 1000, 1<<50)),
		mk("content_memory_mb", false, "", integer(&c.ContentMemoryMB, 16, 1<<20)),
		mk("content_timeout", false, "", duration(&c.ContentTimeout)),
		mk("plan_workers", false, "", integer(&c.PlanWorkers, 1, 256)),
		mk("plans_per_member", false, "", integer(&c.PlansPerMember, 1, 256)),
		mk("plan_cache", false, "", integer(&c.PlanCache, 1, 1<<20)),
		mk("max_shard_units", false, "", integer(&c.MaxShardUnits, 1, 1<<40)),
		mk("max_job_units", false, "", integer(&c.MaxJobUnits, 1, 1<<40)),
		mk("raft_timing", false, "", parsed(func(s string) error {
			if _, ok := RaftTimings[s]; !ok {
				return fmt.Errorf("%q is not a Raft timing profile: use lan (one site) or wan (links of about 150 ms round trip)", s)
			}
			c.RaftTiming = s
			return nil
		}, "lan", "wan")),
		mk("raft_heartbeat_timeout", false, "", duration(&c.RaftHeartbeatTimeout)),
		mk("raft_election_timeout", false, "", duration(&c.RaftElectionTimeout)),
		mk("raft_leader_lease_timeout", false, "", duration(&c.RaftLeaderLeaseTimeout)),
		mk("turn_listen", false, "", str(&c.TURNListen)),
		mk("turn_relay_ip", false, "", parsed(func(s string) error {
			if net.ParseIP(s) == nil {
				return diag.New(diag.P2PConfig, "turn_relay_ip", "%q is not an IP address", s).
					WithHelp("give the address peers reach this node's relays at, e.g. 203.0.113.7")
			}
			c.TURNRelayIP = s
			return nil
		})),
		mk("turn_max_allocations", false, "", integer(&c.TURNMaxAllocations, 1, 1<<20)),
		mk("turn_bandwidth_mb", false, "", integer(&c.TURNBandwidthMB, 1, 1<<20)),
		mk("turn_max_per_member", false, "", integer(&c.TURNMaxPerMember, 1, 1<<20)),
		mk("turn_allow_peers", false, "", strs(&c.TURNAllowPeers, cidr)),
		mk("p2p_loopback", false, "", boolean(&c.P2PLoopback)),
		mk("parent_federation", false, "", str(&c.ParentFederation)),
		mk("delegate_identity", false, "", str(&c.DelegateIdentity)),
		mk("delegate_name", false, "", str(&c.DelegateName)),
		mk("delegate_batch", false, "", integer(&c.DelegateBatch, 1, 256)),
	}
	l, err := load(file, "aggregator config", fields)
	if err != nil {
		return nil, err
	}
	if err := c.raftTimeouts(l); err != nil {
		return nil, err
	}
	c.Pos = l.positions()
	c.Identity = resolve(file, c.Identity)
	c.PassphraseFile = resolve(file, c.PassphraseFile)
	c.Federation = resolve(file, c.Federation)
	c.DataDir = resolve(file, c.DataDir)
	if c.VolunteerWasm != "" {
		c.VolunteerWasm = resolve(file, c.VolunteerWasm)
	}
	if set := []string{c.ParentFederation, c.DelegateIdentity, c.DelegateName}; slices.Contains(set, "") && slices.ContainsFunc(set, func(s string) bool { return s != "" }) {
		key := "parent_federation"
		var given, missing []string
		for i, k := range []string{"parent_federation", "delegate_identity", "delegate_name"} {
			if set[i] != "" {
				key = k
				given = append(given, k)
			} else {
				missing = append(missing, k) // unset, or set to ""
			}
		}
		return nil, c.Pos.At(diag.New(diag.MissingField, key, "a child cluster needs parent_federation, delegate_identity and delegate_name; %s without %s is not enough",
			strings.Join(given, " and "), strings.Join(missing, " and ")), file, key).
			WithHelp("set all three (docs/tree.md), or none for a cluster that is no child")
	}
	if c.ParentFederation != "" {
		c.ParentFederation = resolve(file, c.ParentFederation)
		c.DelegateIdentity = resolve(file, c.DelegateIdentity)
	}
	if c.VolunteerListen != "" && c.VolunteerWasm == "" {
		return nil, c.Pos.At(diag.New(diag.MissingField, "volunteer_wasm", "volunteer_listen is set but volunteer_wasm is not: the page needs the worker compiled to WebAssembly"), file, "volunteer_listen").
			WithHelp("build it with `GOOS=js GOARCH=wasm go build -o scellis.wasm ./cmd/scellis-wasm`, copy $(go env GOROOT)/lib/wasm/wasm_exec.js beside it, and set volunteer_wasm: scellis.wasm")
	}
	return c, nil
}

// Worker configures `scellis worker`: who it is, where the pool is, and the
// budget it gives the pool.
type Worker struct {
	File           string
	Pos            Positions `json:"-"`
	Name           string
	Identity       string
	PassphraseFile string
	Federation     string
	CacheDir       string // job bundles and inputs fetched from the pool
	Parallel       int    // shards at once
	// Batch: up to this many shards leased at once, their commitments
	// and reports sent in one request each (pool.Worker.Batch); 1: one
	// request per shard; 0 (the default): adaptive — what is ready goes
	// together, and short shards are leased ahead (pool/adaptive.go).
	Batch        int
	MemoryMB     int           // per-shard memory budget for content
	ShardTimeout time.Duration // CPU/wall budget per shard
	Poll         time.Duration // wait after a failed lease request
	// LongPoll is how long the leader may hold an idle lease request: a
	// new job's shards reach the worker as soon as they are leasable
	// instead of at its next poll. Positive, like every duration here;
	// the leader holds a request at most 30 s (and half its silo_lease)
	// whatever it says.
	LongPoll      time.Duration
	LogLevel      string // off, error, warn (default: progress lines too), info, debug
	LogFormat     string // text (default) or json
	MetricsListen string // /metrics in plain HTTP (empty: off)
	// Isolate runs each shard in a child process under RLIMIT_AS
	// (memory_mb + 256 MiB) and kills it at shard_timeout. Default true.
	Isolate bool
	// CorruptResults makes the worker return wrong results: a test switch
	// to show that such a worker is out-voted. Never set it in production.
	CorruptResults bool
	// The data plane (docs/dataplane.md). ICEPolicy: all (data channels,
	// direct first, then the relay; the default), relay (TURN only) or
	// https (no data channels). STUN: extra STUN/TURN server URLs
	// (stun:host:port) besides those the aggregator hands out. P2PVia:
	// the aggregator to move blobs with (default: the first in the
	// federation file). P2PLoopback: ICE uses loopback addresses only;
	// deprecated, implied by a federation on loopback addresses (as the
	// aggregator's).
	ICEPolicy   string
	STUN        []string
	P2PVia      string
	P2PLoopback bool
}

// ICEPolicies are the values of ice_policy.
var ICEPolicies = []string{"all", "relay", "https"}

func icePolicy(p *string) parser {
	return parsed(func(s string) error {
		if !slices.Contains(ICEPolicies, s) {
			return diag.New(diag.P2PConfig, "ice_policy", "%q is not an ICE policy", s).
				WithHelp("use all (data channels, direct first, relay after), relay (TURN only) or https (the blob endpoint only)")
		}
		*p = s
		return nil
	}, ICEPolicies...)
}

func stunURL(s string) error {
	if !strings.HasPrefix(s, "stun:") && !strings.HasPrefix(s, "turn:") && !strings.HasPrefix(s, "turns:") {
		return diag.New(diag.P2PConfig, s, "%q is not a STUN or TURN URL", s).
			WithHelp("write stun:host:port (or turn:host:port?transport=udp)")
	}
	return nil
}

// DefaultWorkerLongPoll is a worker's long_poll, as a silo's: a node that
// has gone silent costs a request its hold on top of the attempt's own
// deadline before the client tries another node, so a longer hold would
// stall a worker behind a silent node that long at every attempt.
const DefaultWorkerLongPoll = 2 * time.Second

// DefaultShardMemoryMB and DefaultShardTimeout are a worker's memory_mb
// and shard_timeout, and what a silo gives the generic shards its policy
// takes (each in a child process, as an isolating worker's).
const (
	DefaultShardMemoryMB = 512
	DefaultShardTimeout  = 10 * time.Minute
)

// LoadWorker reads a worker config.
func LoadWorker(file string) (*Worker, error) {
	c := &Worker{File: file, LogLevel: "warn", Parallel: 1, Batch: 0, MemoryMB: DefaultShardMemoryMB, ShardTimeout: DefaultShardTimeout, Poll: 500 * time.Millisecond, LongPoll: DefaultWorkerLongPoll, Isolate: true, ICEPolicy: "all"}
	fields := []field{
		mk("name", true, "the worker's member name in the federation file", str(&c.Name)),
		mk("identity", true, "the private key file made by scellis keygen", str(&c.Identity)),
		mk("passphrase_file", false, "", str(&c.PassphraseFile)),
		mk("federation", true, "the federation file listing every member", str(&c.Federation)),
		mk("cache_dir", true, "a folder for job bundles and inputs fetched from the pool", str(&c.CacheDir)),
		mk("parallel", false, "", integer(&c.Parallel, 1, 256)),
		mk("batch", false, "", integer(&c.Batch, 0, 256)),
		mk("memory_mb", false, "", integer(&c.MemoryMB, 16, 1<<20)),
		mk("shard_timeout", false, "", duration(&c.ShardTimeout)),
		mk("poll", false, "", duration(&c.Poll)),
		mk("long_poll", false, "", duration(&c.LongPoll)),
		mk("corrupt_results", false, "", boolean(&c.CorruptResults)),
		mk("isolate", false, "", boolean(&c.Isolate)),
		mk("log_level", false, "", parsed(func(s string) error {
			if !contains(logLevels, s) {
				return fmt.Errorf("unknown log level %q", s)
			}
			c.LogLevel = s
			return nil
		}, logLevels...)),
		mk("log_format", false, "", logFormat(&c.LogFormat)),
		mk("metrics_listen", false, "", str(&c.MetricsListen)),
		mk("ice_policy", false, "", icePolicy(&c.ICEPolicy)),
		mk("stun", false, "", strs(&c.STUN, stunURL)),
		mk("p2p_via", false, "", str(&c.P2PVia)),
		mk("p2p_loopback", false, "", boolean(&c.P2PLoopback)),
	}
	l, err := load(file, "worker config", fields)
	if err != nil {
		return nil, err
	}
	c.Pos = l.positions()
	c.Identity = resolve(file, c.Identity)
	c.PassphraseFile = resolve(file, c.PassphraseFile)
	c.Federation = resolve(file, c.Federation)
	c.CacheDir = resolve(file, c.CacheDir)
	return c, nil
}

// raftTimeouts fills the Raft timeouts the profile leaves unset and checks
// the order Raft needs: leader lease ≤ heartbeat ≤ election.
func (c *Aggregator) raftTimeouts(l *loaded) error {
	prof := RaftTimings[c.RaftTiming]
	for i, d := range []*time.Duration{&c.RaftHeartbeatTimeout, &c.RaftElectionTimeout, &c.RaftLeaderLeaseTimeout} {
		if *d == 0 {
			*d = prof[i]
		}
	}
	help := "keep raft_leader_lease_timeout ≤ raft_heartbeat_timeout ≤ raft_election_timeout, or set only raft_timing"
	if c.RaftLeaderLeaseTimeout > c.RaftHeartbeatTimeout {
		l.errorf("raft_leader_lease_timeout", diag.InvalidValue, "raft_leader_lease_timeout", help,
			"the leader lease (%v) is longer than the heartbeat timeout (%v)", c.RaftLeaderLeaseTimeout, c.RaftHeartbeatTimeout)
	}
	if c.RaftHeartbeatTimeout > c.RaftElectionTimeout {
		l.errorf("raft_heartbeat_timeout", diag.InvalidValue, "raft_heartbeat_timeout", help,
			"the heartbeat timeout (%v) is longer than the election timeout (%v)", c.RaftHeartbeatTimeout, c.RaftElectionTimeout)
	}
	return l.d.Err()
}

// logFormat parses log_format: text (one key=value line per record) or
// json (one object per line, for a log shipper).
func logFormat(p *string) parser {
	return parsed(func(s string) error {
		if s != "text" && s != "json" {
			return fmt.Errorf("unknown log format %q", s)
		}
		*p = s
		return nil
	}, "text", "json")
}

// cidr checks one entry of turn_allow_peers: an address range in CIDR
// notation.
func cidr(s string) error {
	if _, err := netip.ParsePrefix(s); err != nil {
		return diag.New(diag.P2PConfig, "turn_allow_peers", "%q is not an address range in CIDR notation", s).
			WithHelp("write a range like 127.0.0.0/8 or 10.0.0.0/8 (only for federations on one machine or one private network)")
	}
	return nil
}
