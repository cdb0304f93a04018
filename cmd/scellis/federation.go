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
