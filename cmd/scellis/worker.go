package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/pool"
)

func init() { commands = append(commands, newWorkerCmd) }

func newWorkerCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "worker --config worker.yaml",
		Short: "Execute shards for a pool: lease, run in the sandbox, upload, report",
		Long: `Run a worker: it leases shards from the aggregator cluster, runs each in
the sandbox (no file, network or clock access for the content), uploads the
result bytes to the blob store and reports their hash. Results count only
after other peers agree. The worker renews its leases while it runs and
hands them back when it stops (SIGINT, or 'scellis worker stop').`,
		Example: `  scellis worker --config worker.yaml

  # worker.yaml
  name: worker-1
  identity: worker-1/identity.key
  federation: federation.yaml
  cache_dir: worker-1/cache
  parallel: 2              # shards at once
  shard_timeout: 10m       # budget per shard`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath == "" {
				return usageError{fmt.Errorf("--config is required")}
			}
			c, err := config.LoadWorker(cfgPath)
			if err != nil {
				return err
			}
			id, fed, err := checkWorker(c, cmd.ErrOrStderr(), true)
			if err != nil {
				return err
			}
			client, err := api.NewClient(id, fed)
			if err != nil {
				return err
			}
			builtin, err := catalog.Builtin()
			if err != nil {
				return err
			}
			if err := os.MkdirAll(c.CacheDir, 0o700); err != nil {
				return err
			}
			pidFile := filepath.Join(c.CacheDir, "worker.pid")
			if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
				return err
			}
			defer os.Remove(pidFile)
			logf, closeLog := progressLog(cmd.ErrOrStderr(), c.Name, c.LogFormat, c.LogLevel)
			defer closeLog()
			client.Log = debugLog(cmd.ErrOrStderr(), c.Name, c.LogFormat, c.LogLevel)
			reg, observe := workerMetrics()
			stopMetrics, err := serveMetrics(c.MetricsListen, reg)
			if err != nil {
				return err
			}
			defer stopMetrics()
			w := &pool.Worker{
				Client: client, Name: c.Name, Identity: id, Catalog: builtin, CacheDir: c.CacheDir, Parallel: c.Parallel, Batch: c.Batch,
				MemoryBytes: uint64(c.MemoryMB) << 20, ShardTimeout: c.ShardTimeout, ProcessMemoryBytes: processMemory(c), Poll: c.Poll, LongPoll: c.LongPoll, Corrupt: c.CorruptResults,
				Logf: logf, Observe: observe,
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Follow membership changes (a rotated aggregator key, new
			// members) while the worker runs.
			go api.FollowMembership(ctx, client, fed, membershipPoll, w.Logf)
			if c.ICEPolicy != "https" {
				// Blobs go over a data channel to an aggregator, HTTPS
				// being the fallback (docs/dataplane.md).
				blobs, err := dataplane.StartMember(ctx, dataplane.MemberConfig{
					Identity: id, Fed: fed, Name: c.Name, Policy: c.ICEPolicy, Via: c.P2PVia, STUN: c.STUN, Loopback: c.P2PLoopback,
					HTTPS: client, Logf: w.Logf,
				})
				if err != nil {
					return err
				}
				reg.MustRegister(blobs.Peer.Collector()) // scellis_p2p_* on the worker's /metrics
				w.Blobs = blobs
			}
			fmt.Fprintf(cmd.OutOrStdout(), "worker %s: %d shard(s) at once, pool %s\n", c.Name, c.Parallel, strings.Join(client.Endpoints(), ", "))
			return w.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "worker config file (YAML)")
	cmd.AddCommand(newWorkerStopCmd())
	return cmd
}

func newWorkerStopCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "stop --config worker.yaml",
		Short: "Stop a running worker at once; it hands its leases back",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath == "" {
				return usageError{fmt.Errorf("--config is required")}
			}
			c, err := config.LoadWorker(cfgPath)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(filepath.Join(c.CacheDir, "worker.pid"))
			if err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("no worker is running for %s (no pid file in %s)", cfgPath, c.CacheDir)}
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return &exitError{code: 1, msg: "the worker's pid file is damaged"}
			}
			if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("stopping worker %d: %v", pid, err)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent stop to worker %s (pid %d)\n", c.Name, pid)
			return nil
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "the worker's config file")
	return cmd
}

// processMemory is the address space a shard's child process may add:
// the content's budget plus room for the engine and the job's inputs; 0
// (isolate: false) runs shards in the worker's own process.
func processMemory(c *config.Worker) uint64 {
	if !c.Isolate {
		return 0
	}
	return uint64(c.MemoryMB)<<20 + pool.ChildOverhead
}
