package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/silo"
)

func init() { commands = append(commands, newSiloCmd) }

func newSiloCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "silo --config hospital.yaml",
		Short: "Run a silo: train on local data for the federation's rounds, privately",
		Long: `Run a silo next to its data. It leases its shards of training rounds from
the aggregator cluster and, for each round: checks it against the silo's
policy and privacy ledger (every refusal at once; a refused round is
reported as declined and goes on without this silo), trains locally with the
run's strategy under differential privacy at the dataset's unit, charges the
privacy ledger and syncs it to disk, and only then takes part in secure
aggregation, so the aggregator learns only the sum. It reports a signed
contribution record (ledger entry hash, mechanism) that the round's receipt
cites. Raw data and unmasked updates never leave the process.

At start the silo checks that its key is the federation's silo member
named in the config, opens (or creates) its ledger signed with that key,
and declares each dataset's budget there once; a declared budget is never
raised. With policy.generic_shards it also runs generic pool shards,
beside its training rounds and never ahead of them (each in a child
process at the lowest CPU priority); without it the pool never grants it
one (docs/silo.md, "Rounds and generic work on one silo").
SIGINT or SIGTERM stops it at once, handing its leases back.

Check a config first with 'scellis config check FILE'; see docs/silo.md.`,
		Example: `  scellis silo --config /etc/scellis/hospital-a.yaml

  # hospital-a.yaml
  name: hospital-a                      # this silo's member name in the federation file
  identity: hospital-a/identity.key     # the private key scellis keygen wrote
  federation: federation.yaml           # the members, their roles, keys and addresses
  data_dir: /var/lib/scellis/hospital-a # client state (e.g. SCAFFOLD's) and the ledger
  datasets:                             # raw data never leaves the silo
    - name: cardio                      # how runs and the ledger name it
      path: /srv/data/cardio.csv        # CSV with a header row; numeric features
      label: outcome                    # the label column
      class: confidential               # never on an open pool; or public
      budget: {epsilon: 3, delta: 1.0e-5}   # the most ε the dataset may ever spend
      unit: record                      # record: DP-SGD per example; silo: per update
  policy:                               # checked for every round before anything runs
    strategies: [fedavg, fedprox]       # catalog names or sha256: refs
    max_epsilon_per_round: 0.5
    min_noise_multiplier: 0.8
    min_cohort: 4                       # never below 3
    max_rounds_per_day: 24
    generic_shards: false               # also run sweeps and other pool work`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath == "" {
				return usageError{fmt.Errorf("--config is required")}
			}
			c, err := config.LoadSilo(cfgPath)
			if err != nil {
				return err
			}
			id, fed, err := checkSilo(c, cmd.ErrOrStderr(), true)
			if err != nil {
				return err
			}
			logf, closeLog := progressLog(cmd.ErrOrStderr(), c.Name, c.LogFormat, c.LogLevel)
			defer closeLog()
			a, err := silo.Open(c, id, fed, silo.Options{Logf: logf})
			if err != nil {
				return err
			}
			defer a.Close()
			stopMetrics, err := serveMetrics(c.MetricsListen, a.Metrics())
			if err != nil {
				return err
			}
			defer stopMetrics()
			a.LongPoll = c.Poll
			names := make([]string, 0, len(c.Datasets))
			for _, d := range c.Datasets {
				names = append(names, d.Name)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go api.FollowMembership(ctx, a.Client, fed, membershipPoll, logf)
			if c.ICEPolicy != "https" {
				// Round blobs and secure-aggregation messages go over
				// data channels, HTTPS being the fallback
				// (docs/dataplane.md); the silo opens no port.
				if a.DataPlane, err = dataplane.StartMember(ctx, dataplane.MemberConfig{
					Identity: id, Fed: fed, Name: c.Name, Policy: c.ICEPolicy, Via: c.P2PVia, STUN: c.STUN, Loopback: c.P2PLoopback,
					HTTPS: a.Client, Logf: logf,
				}); err != nil {
					return err
				}
				a.Metrics().MustRegister(a.DataPlane.Peer.Collector()) // scellis_p2p_* on the silo's /metrics
			}
			fmt.Fprintf(cmd.OutOrStdout(), "silo %s: datasets %s; ledger %s; accepts %s; pool %s\n", c.Name,
				strings.Join(names, ", "), c.Ledger, strings.Join(c.Policy.Strategies, ", "), strings.Join(a.Client.Endpoints(), ", "))
			return a.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "silo config file (YAML)")
	return cmd
}
