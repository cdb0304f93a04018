package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/identity"
)

func init() { commands = append(commands, newFederationCmd) }

func newFederationCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "federation",
		Short: "Work with federation files (the members, their roles, keys and addresses)",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a federation file and report every problem at once",
		Long: `Check a federation file without starting anything: unknown keys, bad roles,
malformed or duplicate public keys, duplicate names or addresses, aggregators
without an address. Every problem is reported with its file:line:col; the
exit code is 2 when there is one.`,
		Example: "  scellis federation check federation.yaml",
		Args:    exactArgs(1, "FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFederationCheck(args[0], cmd.OutOrStdout())
		},
	})
	return cmd
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
	count := func(r identity.Role) string {
		n := len(fed.ByRole(r))
		if n == 1 {
			return fmt.Sprintf("1 %s", r)
		}
		return fmt.Sprintf("%d %ss", n, r)
	}
	fmt.Fprintf(stdout, "%s: federation %s (regime %s) is valid: %d members: %s, %s, %s\n",
		path, fed.Name, fed.Regime, len(fed.Members),
		count(identity.Aggregator), count(identity.Silo), count(identity.Worker))
	return nil
}
