package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/topology"
)

func init() { commands = append(commands, newTopologyCmd) }

func newTopologyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "See what a topology does with a federation: its tree of coordinator clusters, and its control fan-out",
		Long: `A topology is catalog content (topology(members, params)) that lays a pool
out as a tree of coordinator clusters: which aggregators replicate each
cluster, which silos and workers each leads, and the fan-out limit. The
built-ins are flat (one cluster leads every member) and tree (by size or
by region); a .star file of your own takes the same path. See
docs/topology.md.`,
	}
	cmd.AddCommand(newTopologyPlanCmd(), newTopologySimulateCmd(), newTopologySplitCmd())
	return cmd
}

// topologyFlags are the flags naming a topology and its params.
type topologyFlags struct {
	ref    string
	params []string
}

func (f *topologyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ref, "topology", topology.Default, "the topology: a catalog name (flat, tree, or one you added), a sha256: ref, or a .star file")
	cmd.Flags().StringArrayVar(&f.params, "param", nil, "a topology parameter KEY=VALUE (repeatable); integers, numbers and true/false are typed, anything else is a string")
}

// resolve opens the catalog and finds the topology and its params.
func (f *topologyFlags) resolve() (*catalog.Catalog, *catalog.Entry, map[string]any, error) {
	params, err := parseParams(f.params)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := openCatalog()
	if c == nil {
		return nil, nil, nil, err
	}
	wd, _ := os.Getwd()
	e, err := topology.Resolve(c, f.ref, wd)
	if err != nil {
		return nil, nil, nil, err
	}
	return c, e, params, nil
}

// plan evaluates the topology over the federation file's members.
func (f *topologyFlags) plan(ctx context.Context, fedFile string) (*identity.Federation, *topology.Plan, error) {
	fed, err := identity.LoadFederation(fedFile)
	if err != nil {
		return nil, nil, err
	}
	c, e, params, err := f.resolve()
	if err != nil {
		return nil, nil, err
	}
	p, err := topology.Evaluate(ctx, c, e, topology.Members(fed), params)
	if err != nil {
		return nil, nil, err
	}
	return fed, p, nil
}

// parseParams reads KEY=VALUE pairs, typing each value as YAML would a
// plain scalar: an integer, a number, true or false, else a string.
func parseParams(kvs []string) (map[string]any, error) {
	out := map[string]any{}
	var ds diag.List
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			ds = append(ds, diag.New(diag.InvalidValue, "--param", "%q is not KEY=VALUE", kv).
				WithHelp("write --param fanout=32 (repeat --param for each parameter)"))
			continue
		}
		if _, dup := out[k]; dup {
			ds = append(ds, diag.New(diag.ConfigDuplicate, "--param", "parameter %q is given twice", k).WithHelp("keep one"))
			continue
		}
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = i
		} else if x, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(x) && !math.IsInf(x, 0) {
			out[k] = x // nan and inf stay strings, as in YAML: a NaN param broke --json
		} else if b, err := strconv.ParseBool(v); err == nil && (v == "true" || v == "false") {
			out[k] = b
		} else {
			out[k] = v
		}
	}
	return out, ds.Err()
}

func newTopologyPlanCmd() *cobra.Command {
	var tf topologyFlags
	var fedFile string
	cmd := &cobra.Command{
		Use:   "plan --federation FILE [--topology NAME|FILE] [--param KEY=VALUE]...",
		Short: "Print the tree of coordinator clusters a topology makes of a federation",
		Long: `Evaluate a topology over the machines of a federation file (their names,
roles, and the optional region and capacity) and print the validated plan:
each cluster's aggregator nodes, the silos and workers it leads, its child
clusters, and where each round's partial sums form. Nothing is started.
A plan that is not a tree placing every member once, breaks its fan-out
limit, or splits silos into a sub-cohort below three sites is refused with
a diagnostic (exit code 2).`,
		Example: `  scellis topology plan --federation federation.yaml
  scellis topology plan --federation federation.yaml --topology tree --param by=region
  scellis topology plan --federation federation.yaml --topology ./my-layout.star --json`,
		Args: exactArgs(0, "no arguments (the federation file goes in --federation)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fedFile == "" {
				return usageError{fmt.Errorf("--federation FILE is required")}
			}
			_, p, err := tf.plan(cmd.Context(), fedFile)
			if err != nil {
				return err
			}
			if jsonOutput {
				return writeCatalogJSON(cmd.OutOrStdout(), p)
			}
			return p.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&fedFile, "federation", "", "the federation file whose members to lay out")
	tf.add(cmd)
	return cmd
}

func newTopologySimulateCmd() *cobra.Command {
	var tf topologyFlags
	var members, fanouts []int
	var shards, replicas int
	cmd := &cobra.Command{
		Use:   "simulate [--members N]... [--fanout F]... [--shards S] [--replicas R]",
		Short: "Count control exchanges per coordinator cluster, flat against tree, in process",
		Long: `Simulate the control fan-out of a pool without any network: for each
--members N, a synthetic federation of N silos is laid out by the built-in
flat topology and by tree with each --fanout (3 aggregators per cluster),
and the exchanges each cluster's leader serves are counted — per
federated round (13 per silo: lease, job status, bundle, model, the seven
secure-aggregation messages, contribution upload and report; 8 per child
cluster, which relays its sub-cohort's masked sum: lease, bundle, model,
outer key sent and fetched, the partial sum, records upload, report) and
per pool job of --shards shards with --replicas replicas (lease, commit,
upload, report per replica; job status and bundle per executing member;
per child cluster, job status and bundle, then lease, upload and report
per range of 50 shards of its subtree). As built, only one-replica jobs
are delegated to child clusters (docs/tree.md, "Limits"), hence the
default --replicas 1. With --topology, that topology (and its --param)
is simulated instead of the built-ins. docs/topology.md states the model
and its table.`,
		Example: "  scellis topology simulate\n  scellis topology simulate --members 100000 --fanout 32",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, n := range members {
				if n < 1 || n > 1_000_000 {
					return diag.New(diag.InvalidValue, "--members", "%d members is outside 1..10^6", n).WithHelp("simulate up to a million members")
				}
			}
			for _, f := range fanouts {
				if f < 3 || f > 1<<30 {
					return diag.New(diag.InvalidValue, "--fanout", "fan-out %d is outside 3..2^30", f).WithHelp("a cluster must lead at least three silos (the three-site minimum), and a plan's fan-out limit is at most 2^30")
				}
			}
			if _, err := parseParams(tf.params); err != nil {
				return err
			}
			if len(tf.params) > 0 && !cmd.Flags().Changed("topology") {
				return diag.New(diag.InvalidValue, "--param", "--param sets a parameter of --topology, which is not given").
					WithHelp("name the topology to simulate with --topology NAME|FILE, or drop --param to compare flat with tree")
			}
			var sims []topology.Simulation
			ctx := cmd.Context()
			if cmd.Flags().Changed("topology") {
				c, e, params, err := tf.resolve()
				if err != nil {
					return err
				}
				for _, n := range members {
					s, err := simulateOne(ctx, c, e, params, n, 3*topology.ClustersFor(n, fanouts[0]), shards, replicas)
					if err != nil {
						return err
					}
					sims = append(sims, s)
				}
			} else {
				c, err := openCatalog()
				if c == nil {
					return err
				}
				flat, err := topology.Resolve(c, topology.Default, "")
				if err != nil {
					return err
				}
				tree, err := topology.Resolve(c, "tree", "")
				if err != nil {
					return err
				}
				for _, n := range members {
					s, err := simulateOne(ctx, c, flat, nil, n, 3, shards, replicas)
					if err != nil {
						return err
					}
					sims = append(sims, s)
					for _, f := range fanouts {
						s, err := simulateOne(ctx, c, tree, map[string]any{"fanout": int64(f)}, n, 3*topology.ClustersFor(n, f), shards, replicas)
						if err != nil {
							return err
						}
						sims = append(sims, s)
					}
				}
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeCatalogJSON(out, map[string]any{
					"round_exchanges": topology.RoundExchanges, "shard_exchanges": topology.ShardExchanges,
					"job_exchanges": topology.JobExchanges, "child_round_exchanges": topology.ChildRoundExchanges,
					"delegation_job_exchanges": topology.DelegationJobExchanges, "delegation_batch_exchanges": topology.DelegationBatchExchanges,
					"delegate_batch": topology.DelegateBatch,
					"simulations":    sims,
				})
			}
			return topology.WriteTable(out, sims)
		},
	}
	cmd.Flags().IntSliceVar(&members, "members", []int{1_000, 10_000, 100_000}, "silos in the synthetic federation (repeatable)")
	cmd.Flags().IntSliceVar(&fanouts, "fanout", []int{32, 100}, "fan-out of the tree topology (repeatable)")
	cmd.Flags().IntVar(&shards, "shards", 0, "shards of the simulated pool job (0: as many as members)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per shard (1: what a tree delegates to its children as built; the consortium default is 2)")
	flagRange(cmd, "shards", "0", "1000000000")
	flagRange(cmd, "replicas", "1", "16")
	tf.add(cmd)
	return cmd
}

func simulateOne(ctx context.Context, c *catalog.Catalog, e *catalog.Entry, params map[string]any, n, aggregators, shards, replicas int) (topology.Simulation, error) {
	if shards == 0 {
		shards = n
	}
	return topology.SimulateSynthetic(ctx, c, e, params, aggregators, n, shards, replicas)
}
