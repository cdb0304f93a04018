package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/topology"
)

// newTopologySplitCmd makes the files a tree of clusters runs from
// (docs/tree.md): the topology's plan of one pool federation becomes one
// federation file per cluster, a delegate key per child cluster, and an
// aggregator config per node.
func newTopologySplitCmd() *cobra.Command {
	var tf topologyFlags
	var fedFile, out string
	cmd := &cobra.Command{
		Use:   "split --federation FILE --out DIR [--topology NAME|FILE] [--param KEY=VALUE]...",
		Short: "Write the federation files, delegate keys and node configs of the tree of clusters a topology makes",
		Long: `Evaluate a topology over a pool's federation file (as 'topology plan'
does) and write, for each cluster of the plan, DIR/CLUSTER/:

  federation.yaml   the cluster's own federation: its aggregator nodes, the
                    silos and workers it leads, every person of the pool,
                    one member of role cluster per child cluster, with
                    that child's delegate key, and the silos each child
                    leads (with cluster: CHILD, for hierarchical rounds)
  NODE.yaml         an aggregator config per node (identity NODE/identity.key,
                    data in NODE/data); a child cluster's nodes also name
                    their parent (parent_federation, delegate_identity,
                    delegate_name)
  delegate/identity.key   (child clusters) the delegate key, which every
                    node of the child reads; copy it to each node's host

Each cluster is then an ordinary cluster: start the root's nodes, then the
children's, and point each silo or worker at its cluster's federation file
(a silo a child leads also names its parent's in parent_federation, to
check every round's bundle with the parent; no silo config is written, and
the command names each child's silos and the line their configs need).
Nothing is overwritten: a cluster folder that holds a federation file
already is refused.`,
		Example: `  scellis topology split --federation pool.yaml --topology ./by-site.star --out tree
  scellis topology split --federation pool.yaml --topology tree --param by=region --out tree`,
		Args: exactArgs(0, "no arguments (the federation file goes in --federation)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fedFile == "" || out == "" {
				return usageError{fmt.Errorf("--federation FILE and --out DIR are required")}
			}
			fed, p, err := tf.plan(cmd.Context(), fedFile)
			if err != nil {
				return err
			}
			if err := splitTree(fed, p, out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, cl := range p.Clusters {
				parent := "the root"
				if cl.Parent != "" {
					parent = "a child of " + cl.Parent
				}
				fmt.Fprintf(w, "cluster %s (%s): %s, leads %s; files in %s\n", cl.Name, parent,
					plural(len(cl.Nodes), "node"), plural(len(cl.Leads), "member"), filepath.Join(out, cl.Name))
				// Its silos check every hierarchical round with the
				// parent: their configs (not written here) name it.
				var silos []string
				for _, n := range cl.Leads {
					if m, ok := fed.Member(n); ok && m.Role == identity.Silo {
						silos = append(silos, n)
					}
				}
				if cl.Parent != "" && len(silos) > 0 {
					fmt.Fprintf(w, "  silo configs of %s: add parent_federation: %s\n", strings.Join(silos, ", "), filepath.Join(out, cl.Parent, "federation.yaml"))
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&fedFile, "federation", "", "the pool's federation file: every machine and person of the tree")
	cmd.Flags().StringVar(&out, "out", "", "the folder to write one sub-folder per cluster into")
	tf.add(cmd)
	return cmd
}

// splitTree writes the plan's clusters' files under out (see
// newTopologySplitCmd).
func splitTree(fed *identity.Federation, p *topology.Plan, out string) error {
	if fi, err := os.Stat(out); err == nil && !fi.IsDir() {
		return diag.New(diag.InvalidValue, "--out", "%s is a file, not a folder; nothing was written", out).
			WithHelp("give --out a new or empty folder")
	}
	delegates := map[string]*identity.Identity{}
	for _, cl := range p.Clusters {
		if m, taken := fed.Member(cl.Name); taken {
			return diag.New(diag.TopologyInvalid, cl.Name, "cluster %s has the name of a member of %s: a child cluster becomes a member of its parent's federation under its name", cl.Name, fed.File).
				At(m.Pos.File, m.Pos.Line, m.Pos.Col).
				WithHelp("name the clusters apart from every member")
		}
		if len(cl.Name) > 63 {
			return diag.New(diag.TopologyInvalid, cl.Name, "cluster name %q has more than 63 bytes: a child cluster's name is a member name in its parent's federation", cl.Name).
				WithHelp("use a shorter cluster name")
		}
		if _, err := os.Stat(filepath.Join(out, cl.Name, "federation.yaml")); err == nil {
			return diag.New(diag.InvalidValue, "--out", "%s holds a federation file already; nothing was written", filepath.Join(out, cl.Name)).
				WithHelp("give an empty --out folder; split never overwrites keys or federation files")
		}
		// A node's files are DIR/NODE.yaml and DIR/NODE/: a node named
		// after the cluster's own files would overwrite them, or take the
		// delegate key for its identity.
		for _, n := range cl.Nodes {
			if n == "federation" || (n == "delegate" && cl.Parent != "") {
				m, _ := fed.Member(n)
				return diag.New(diag.TopologyInvalid, n, "aggregator %s of cluster %s: its files (%s) would be the cluster's own (%s); nothing was written", n, cl.Name,
					filepath.Join(out, cl.Name, n+".yaml")+", "+filepath.Join(out, cl.Name, n)+"/", map[bool]string{true: "federation.yaml", false: "delegate/identity.key"}[n == "federation"]).
					At(m.Pos.File, m.Pos.Line, m.Pos.Col).
					WithHelp("rename the aggregator in %s (split names each node's config and folder after it)", fed.File)
			}
		}
		if cl.Parent != "" {
			id, err := identity.Generate()
			if err != nil {
				return err
			}
			delegates[cl.Name] = id
		}
	}
	var people []identity.Member
	for _, m := range fed.Members {
		if m.Role.Person() {
			people = append(people, m)
		}
	}
	for _, cl := range p.Clusters {
		dir := filepath.Join(out, cl.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var b strings.Builder
		name := fed.Name + "-" + cl.Name
		if len(name) > 63 {
			name = cl.Name
		}
		fmt.Fprintf(&b, "# Cluster %s of %s, written by scellis topology split.\nfederation: %s\nregime: %s\nmembers:\n", cl.Name, fed.File, name, fed.Regime)
		var members []identity.Member
		for _, n := range append(append([]string{}, cl.Nodes...), cl.Leads...) {
			m, _ := fed.Member(n)
			members = append(members, m)
		}
		for _, m := range append(members, people...) {
			fmt.Fprintf(&b, "  - name: %s\n    role: %s\n    public_key: %s\n", m.Name, m.Role, m.PublicKey)
			if m.Address != "" {
				fmt.Fprintf(&b, "    address: %s\n", m.Address)
			}
			if m.RaftAddress != "" {
				fmt.Fprintf(&b, "    raft_address: %s\n", m.RaftAddress)
			}
		}
		for _, k := range cl.Children {
			fmt.Fprintf(&b, "  - name: %s\n    role: cluster\n    public_key: %s\n", k, delegates[k].Public())
		}
		// The silos each child leads, so that a run here can name them
		// in its cohort and sum their round at that child (hierarchical
		// secure aggregation): their keys, and the child that leads them.
		for _, k := range cl.Children {
			for _, s := range p.SubCohort(k) {
				m, _ := fed.Member(s)
				fmt.Fprintf(&b, "  - name: %s\n    role: silo\n    public_key: %s\n    cluster: %s\n", m.Name, m.PublicKey, k)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "federation.yaml"), []byte(b.String()), 0o644); err != nil {
			return err
		}
		var child string
		if id := delegates[cl.Name]; id != nil {
			if err := os.MkdirAll(filepath.Join(dir, "delegate"), 0o700); err != nil {
				return err
			}
			if err := identity.Save(filepath.Join(dir, "delegate", "identity.key"), id, identity.SaveOptions{}); err != nil {
				return err
			}
			child = fmt.Sprintf("parent_federation: ../%s/federation.yaml\ndelegate_identity: delegate/identity.key\ndelegate_name: %s\n", cl.Parent, cl.Name)
		}
		for _, n := range cl.Nodes {
			cfg := fmt.Sprintf("name: %s\nidentity: %s/identity.key\nfederation: federation.yaml\ndata_dir: %s/data\n%s", n, n, n, child)
			if err := os.WriteFile(filepath.Join(dir, n+".yaml"), []byte(cfg), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
