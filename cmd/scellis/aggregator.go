package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/aggregator"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/wire"
)

func init() { commands = append(commands, newAggregatorCmd) }

func newAggregatorCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "aggregator --config agg.yaml",
		Short: "Run an aggregator node (coordinator replica, API, blob store, reducer peer)",
		Long: `Run one node of the aggregator cluster. The node replicates the
coordinator state and the receipt chain with Raft (log and snapshots on local
disk under data_dir), serves the control-plane API and the blob endpoint over
mutual TLS pinned to the federation file, and reduces verified results.

The cluster is every aggregator in the federation file; a new cluster
bootstraps itself the first time its nodes start. Stop a node with SIGINT
or SIGTERM: a leader hands leadership to the most up-to-date follower first.`,
		Example: `  scellis aggregator --config agg.yaml

  # agg.yaml
  name: agg-1                 # this node's member name in the federation file
  identity: agg-1/identity.key
  federation: federation.yaml
  data_dir: agg-1/data
  lease_ttl: 30s              # how long a worker holds a shard without renewing
  round_join_timeout: 2m      # backstop: how long a round waits for silos to join
  silo_lease: 6s              # a silo (or child cluster) silent this long is left out of rounds until it polls again
  round_attempts: 5           # failed attempts of one round before the run pauses
  round_retry_backoff: 1s     # wait before retrying a failed round, doubled each time
  # listen: 0.0.0.0:7400      # bind here instead of the federation address
  # raft_listen: 0.0.0.0:7401 # (NAT, containers); the federation's stay advertised
  # studio_listen: 127.0.0.1:7480  # the Studio, the live web view (off by default)
  # volunteer_listen: 0.0.0.0:7490  # the volunteer page for browsers (open pools; off by default)
  # volunteer_wasm: scellis.wasm    # its worker, built with (wasm_exec.js beside it):
  #   GOOS=js GOARCH=wasm go build -o scellis.wasm ./cmd/scellis-wasm
  #   cp "$(go env GOROOT)/lib/wasm/wasm_exec.js" .
  # volunteer_difficulty: 18        # the join proof of work, in bits
  # volunteer_max_leases: 8         # shards one volunteer tab may hold at once
  raft_timing: lan            # lan (default: 1s heartbeat and election, 500ms
                              # leader lease) or wan (3s, 3s, 1.5s: links of
                              # ~150 ms round trip); or set each of
                              # raft_heartbeat_timeout, raft_election_timeout,
                              # raft_leader_lease_timeout`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath == "" {
				return usageError{fmt.Errorf("--config is required")}
			}
			c, err := config.LoadAggregator(cfgPath)
			if err != nil {
				return err
			}
			id, fed, err := checkAggregator(c, cmd.ErrOrStderr(), true)
			if err != nil {
				return err
			}
			delegate, err := childDelegate(cmd.Context(), c, true)
			if err != nil {
				return err
			}
			n, err := aggregator.Start(c.Name, id, fed, c.DataDir, aggregator.Options{
				LeaseTTL: c.LeaseTTL, Log: cmd.ErrOrStderr(), LogLevel: c.LogLevel, LogFormat: c.LogFormat, Join: c.Join,
				SecAgg:    wire.Deadlines{Advertise: c.RoundJoinTimeout},
				SiloLease: c.SiloLease, RoundAttempts: c.RoundAttempts, RetryBackoff: c.RoundRetryBackoff,
				SnapshotThreshold: c.SnapshotThreshold, SnapshotInterval: c.SnapshotInterval, TrailingLogs: c.TrailingLogs, SegmentBytes: c.SegmentBytes,
				Listen: c.Listen, RaftListen: c.RaftListen, HealthListen: c.HealthListen, MetricsListen: c.MetricsListen, StudioListen: c.StudioListen,
				VolunteerListen: c.VolunteerListen, VolunteerWasm: c.VolunteerWasm, VolunteerDifficulty: c.VolunteerDifficulty, VolunteerMaxLeases: c.VolunteerMaxLeases,
				TURNListen: c.TURNListen, TURNRelayIP: c.TURNRelayIP, TURNMaxAllocations: c.TURNMaxAllocations,
				TURNBandwidth: int64(c.TURNBandwidthMB) << 20, P2PLoopback: c.P2PLoopback,
				TURNMaxPerMember: c.TURNMaxPerMember, TURNAllowPeers: prefixes(c.TURNAllowPeers),
				RaftHeartbeat: c.RaftHeartbeatTimeout, RaftElection: c.RaftElectionTimeout, RaftLeaderLease: c.RaftLeaderLeaseTimeout,
				Content: aggregator.ContentCaps{
					Steps: uint64(c.ContentSteps), MemoryBytes: uint64(c.ContentMemoryMB) << 20, WallClock: c.ContentTimeout,
					MaxShardUnits: int64(c.MaxShardUnits), MaxJobUnits: int64(c.MaxJobUnits),
					Workers: c.PlanWorkers, PerMember: c.PlansPerMember, CacheSize: c.PlanCache,
				},
				Delegate: delegate,
				ReloadIdentity: func() (*identity.Identity, error) {
					return loadIdentity(c.Identity, c.PassphraseFile)
				},
			})
			if err != nil {
				return err
			}
			// SIGHUP: load the identity file again, to pick up a rotated
			// key put in place after the rotation applied.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go func() {
				for range hup {
					n.ReloadIdentity()
				}
			}()
			fmt.Fprintf(cmd.OutOrStdout(), "aggregator %s serving https://%s (raft %s), data in %s\n", c.Name, n.Self.Address, n.Self.RaftAddress, c.DataDir)
			if a, fp := n.StudioAddr(); a != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "aggregator %s studio at https://%s/ (sign in: scellis studio token --member NAME; browsers get a certificate made at start, SHA-256 %s)\n", c.Name, a, fp)
			}
			if a, fp := n.VolunteerAddr(); a != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "aggregator %s volunteer page at https://%s/ (certificate made at start, SHA-256 %s)\n", c.Name, a, fp)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			fmt.Fprintf(cmd.OutOrStdout(), "aggregator %s stopping\n", c.Name)
			// A stopping leader hands over first, so the cluster keeps a
			// leader instead of waiting out an election timeout.
			hctx, cancel := context.WithTimeout(context.Background(), 2*c.RaftElectionTimeout+time.Second)
			if to, err := n.HandOver(hctx); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "aggregator %s: leadership transfer failed (%v); the others will elect a leader\n", c.Name, err)
			} else if to != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "aggregator %s handed leadership to %s\n", c.Name, to)
			}
			cancel()
			return closeWithin(n.Close, stopBound, cmd.ErrOrStderr(), "aggregator "+c.Name)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "aggregator config file (YAML)")
	cmd.AddCommand(newAggregatorStatusCmd(), newAggregatorMemberCmd(true), newAggregatorMemberCmd(false))
	return cmd
}

// childDelegate loads and checks a child cluster's delegate settings
// (docs/tree.md): the parent federation lists delegate_name as a cluster
// with the delegate key, and (with probe, at start) some parent
// aggregator answers it. Nil when the node is no child.
func childDelegate(ctx context.Context, c *config.Aggregator, probe bool) (*aggregator.Delegate, error) {
	if c.ParentFederation == "" {
		return nil, nil
	}
	// A parent file or delegate key that cannot be read is reported at
	// the config line naming it.
	atKey := func(err error, key string) error {
		ds := asList(err)
		for _, d := range ds {
			if d.Pos == nil {
				c.Pos.At(d, c.File, key)
			}
		}
		return ds
	}
	parent, err := identity.LoadFederation(c.ParentFederation)
	if err != nil {
		return nil, atKey(err, "parent_federation")
	}
	key, err := loadIdentity(c.DelegateIdentity, "")
	if err != nil {
		return nil, atKey(err, "delegate_identity")
	}
	d := &aggregator.Delegate{Name: c.DelegateName, Identity: key, Parent: parent, Batch: c.DelegateBatch}
	if err := aggregator.CheckDelegate(d); err != nil {
		// A refusal the parent file cannot position (a delegate_name it
		// does not list) points at the config's delegate_name.
		if ds, ok := diag.As(err); ok && (ds[0].Pos == nil || ds[0].Pos.File == "") {
			return nil, c.Pos.At(ds[0], c.File, "delegate_name")
		}
		return nil, err
	}
	if !probe {
		return d, nil
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := aggregator.ProbeParent(pctx, d); err != nil {
		if ds, ok := diag.As(err); ok {
			return nil, c.Pos.At(ds[0], c.File, "parent_federation")
		}
		return nil, err
	}
	return d, nil
}

// stopBound is how long a stopping node may take to close once it has
// handed over. Past it the node exits anyway: what it accepted is on disk
// (the Raft log and the blob store sync before they acknowledge), so a
// restart recovers as after a crash, and an operator's stop must not hang.
const stopBound = 20 * time.Second

// closeWithin runs close, and returns its error; if close has not
// returned within bound it writes every goroutine's stack to w (what the
// stop was stuck on, for a bug report) and returns an error instead.
func closeWithin(close func() error, bound time.Duration, w io.Writer, what string) error {
	done := make(chan error, 1)
	go func() { done <- close() }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		fmt.Fprintf(w, "%s: stopping took over %s; exiting anyway (what it accepted is on disk). Its goroutines:\n", what, bound)
		pprof.Lookup("goroutine").WriteTo(w, 2)
		return fmt.Errorf("%s did not close within %s", what, bound)
	}
}

func newAggregatorStatusCmd() *cobra.Command {
	var f memberFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every aggregator: leader, term, commit and applied index, receipt-chain head",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, fed, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			var all []json.RawMessage
			w := cmd.OutOrStdout()
			if !jsonOutput {
				fmt.Fprintf(w, "%-12s %-10s %6s %8s %8s %6s  %-14s %-12s %s\n", "node", "state", "term", "commit", "applied", "chain", "head", "leader", "leader contact")
			}
			for _, m := range fed.ByRole(identity.Aggregator) {
				raw, err := c.StatusOf(ctx, "https://"+m.Address)
				if err != nil {
					if !jsonOutput {
						fmt.Fprintf(w, "%-12s unreachable: %v\n", m.Name, err)
					}
					continue
				}
				all = append(all, raw)
				var st aggregator.NodeStatus
				if json.Unmarshal(raw, &st) == nil && !jsonOutput {
					contact := "none (stale: refuses reads)"
					if st.Raft.LeaderContactMs >= 0 {
						contact = fmt.Sprintf("%dms ago", st.Raft.LeaderContactMs)
						if !st.Raft.Fresh {
							contact += " (stale: refuses reads)"
						}
					}
					fmt.Fprintf(w, "%-12s %-10s %6d %8d %8d %6d  %-14s %-12s %s\n", st.Node, st.Raft.State, st.Raft.Term,
						st.Raft.CommitIndex, st.Raft.AppliedIndex, st.ChainSeq, st.ChainHead.Short(), st.Raft.Leader.ID, contact)
					dataPlaneLines(w, st)
				}
			}
			if jsonOutput {
				b, _ := json.MarshalIndent(all, "", "  ")
				printJSON(w, b)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newAggregatorMemberCmd(join bool) *cobra.Command {
	var f memberFlags
	use, short := "join MEMBER", "Add an aggregator to the Raft voters (run with an aggregator's or an operator's identity)"
	long := `Add a running aggregator to the cluster's voters. Before joining, add the
member while the federation runs (scellis federation add NAME --role
aggregator --public-key KEY --address HOST:PORT --raft-address HOST:PORT; or,
before it starts, list it in every node's federation file), and start the new
node with join: true in its config so it does not bootstrap a cluster of its
own.`
	if !join {
		use, short = "leave MEMBER", "Remove an aggregator from the Raft voters"
		long = "Remove an aggregator from the cluster's voters; stop it afterwards."
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  exactArgs(1, "MEMBER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			op, verb := c.Join, "joined"
			if !join {
				op, verb = c.Leave, "left"
			}
			if err := op(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s the cluster\n", args[0], verb)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// dataPlaneLines prints, under a node's line, which path each peer pair's
// blobs took (docs/dataplane.md) and its TURN relay's metrics.
func dataPlaneLines(w io.Writer, st aggregator.NodeStatus) {
	dp := st.DataPlane
	if dp == nil {
		return
	}
	for _, p := range dp.Pairs {
		fmt.Fprintf(w, "  p2p %s ↔ %s: path %s, direct %d B, relayed %d B, https %d B (%d transfers, %d fallbacks)\n",
			st.Node, p.Peer, p.Path, p.DirectBytes, p.RelayedBytes, p.HTTPSBytes, p.Transfers, p.Fallbacks)
	}
	if t := dp.TURN; t != nil {
		fmt.Fprintf(w, "  turn %s: %d allocations, %d B relayed, %d refused, %d peers refused\n", t.Listen, t.Allocations, t.RelayedBytes, t.Refused, t.Denied)
	}
}

// prefixes parses turn_allow_peers, which config.LoadAggregator has
// checked already.
func prefixes(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}
