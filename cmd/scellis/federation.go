package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

func init() { commands = append(commands, newFederationCmd) }

func newFederationCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "federation",
		Short: "Federation files and the membership: check, init, and add, revoke or rotate members while it runs",
	}
	cmd.AddCommand(newFederationInitCmd())
	cmd.AddCommand(newFederationChangeCmds()...)
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a federation file and report every problem at once",
		Long: `Check a federation file without starting anything: unknown keys, bad roles,
malformed or duplicate public keys, duplicate names or addresses, aggregators
without an address or a raft_address (an aggregator refuses to start without
one). Every problem is reported with its file:line:col; the
exit code is 2 when there is one.`,
		Example: "  scellis federation check federation.yaml",
		Args:    exactArgs(1, "FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFederationCheck(args[0], cmd.OutOrStdout())
		},
	})
	return cmd
}

// daemonRefusals reports what a valid federation file still lacks for
// the daemons to start: every aggregator replicates through Raft, so an
// aggregator entry without raft_address is refused when that aggregator
// starts — federation check says so first.
func daemonRefusals(fed *identity.Federation) error {
	var ds diag.List
	for _, m := range fed.ByRole(identity.Aggregator) {
		if m.RaftAddress == "" {
			ds = append(ds, diag.New(diag.MemberAddress, "member "+m.Name, "aggregator %s has no raft_address; it would refuse to start", m.Name).
				At(m.Pos.File, m.Pos.Line, m.Pos.Col).
				WithHelp("add raft_address: host:port where %s replicates with the other aggregators (its own port, such as the API port + 1); 'scellis keygen --role aggregator --raft-address …' prints it", m.Name))
		}
	}
	return ds.Err()
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// federationMember is one member in `federation check --json`.
type federationMember struct {
	Name        string `json:"name"`
	Role        string `json:"role"`
	PublicKey   string `json:"public_key"`
	Address     string `json:"address,omitempty"`
	RaftAddress string `json:"raft_address,omitempty"`
}

func runFederationCheck(path string, stdout io.Writer) error {
	fed, err := identity.LoadFederation(path)
	if err != nil {
		return err
	}
	if err := daemonRefusals(fed); err != nil {
		return err
	}
	if jsonOutput {
		out := struct {
			Federation string             `json:"federation"`
			Regime     string             `json:"regime"`
			Members    []federationMember `json:"members"`
		}{fed.Name, string(fed.Regime), []federationMember{}}
		for _, m := range fed.Members {
			out.Members = append(out.Members, federationMember{m.Name, string(m.Role), m.PublicKey.String(), m.Address, m.RaftAddress})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "%s: federation %s (regime %s) is valid: %s: %s, %s, %s\n",
		path, fed.Name, fed.Regime, plural(len(fed.Members), "member"),
		plural(len(fed.ByRole(identity.Aggregator)), "aggregator"),
		plural(len(fed.ByRole(identity.Silo)), "silo"),
		plural(len(fed.ByRole(identity.Worker)), "worker"))
	return nil
}
