package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/studio"
)

func init() { commands = append(commands, newStudioCmd) }

func newStudioCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "studio",
		Short: "The live web view: sign viewers in",
		Long: `Each aggregator node with studio_listen in its config serves the Studio, a
live web view of the federation over HTTPS: jobs and their sweep heatmaps,
training runs and their loss curves, each silo's (ε, δ), receipts and cluster
health. Viewers sign in with a short-lived token (scellis studio token) or a
member's client certificate. See docs/studio.md.`,
	}
	cmd.AddCommand(newStudioTokenCmd())
	return cmd
}

func newStudioTokenCmd() *cobra.Command {
	var f memberFlags
	var member, addr string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "token --member NAME [--ttl 8h] [--studio HOST:PORT]",
		Short: "Sign a short-lived Studio viewer token with a member's identity key",
		Long: `Token signs a viewer token for a member with that member's own identity key
(Ed25519 over the claims: member, issue and expiry time, a random nonce). A
Studio node checks it against the member's public key in its federation file
on every request; it expires after --ttl (at most 24h). What the viewer sees
depends on the member's role: a silo sees its own ledger records in full,
everyone sees what the privacy report publishes.

With --studio, it prints the URL to open (the token is moved into an HttpOnly
cookie and out of the address bar on first load).`,
		Example: `  scellis studio token --member hospital-1 --ttl 8h
  scellis studio token --member alice --studio 127.0.0.1:7480`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if member == "" {
				return usageError{fmt.Errorf("--member is required")}
			}
			if ttl <= 0 || ttl > studio.MaxTTL {
				return diag.New(diag.FlagValue, "--ttl", "a viewer token lives more than 0 and at most %s, not %s", studio.MaxTTL, ttl).
					WithHelp("issue a token per working session, e.g. --ttl 8h")
			}
			id, fed, err := f.loadMember(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			self, _ := fed.Lookup(id.Public())
			if self.Name != member {
				return diag.New(diag.FlagValue, "--member", "the identity key is %s's, not %s's: a viewer token is signed by the member's own key", self.Name, member).
					WithHelp("run this with %s's identity (--identity or SCELLIS_IDENTITY)", member)
			}
			tok, c, err := studio.IssueToken(id, fed, ttl, time.Now())
			if err != nil {
				return err
			}
			url := ""
			if addr != "" {
				url = "https://" + addr + "/?token=" + tok
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return json.NewEncoder(out).Encode(map[string]any{"member": c.Member, "expires": time.Unix(c.Expiry, 0).UTC(), "token": tok, "url": url})
			}
			if url != "" {
				fmt.Fprintln(out, url)
			} else {
				fmt.Fprintln(out, tok)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "viewer token for %s, valid until %s\n", c.Member, time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&member, "member", "", "the member the token admits (the identity key must be its key)")
	cmd.Flags().DurationVar(&ttl, "ttl", 8*time.Hour, "how long the token is valid (at most 24h)")
	cmd.Flags().StringVar(&addr, "studio", "", "a Studio address host:port, to print the URL to open")
	return cmd
}
