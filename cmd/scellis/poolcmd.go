package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/scellis/scellis/coordinator"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newPoolCmd) }

func newPoolCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "The pool's peers: their verification records, and re-admission of excluded ones",
		Long: `Adaptive jobs (verification: {mode: adaptive}) spot-check peers by their
record: a peer is trusted after a streak of valid checks, a failed check
(a re-execution or a canary that disagrees) resets it and re-checks the
peer's recent results, and a repeat offender is excluded until an operator
re-admits it.`,
	}
	cmd.AddCommand(newPoolPeersCmd(), newPoolReadmitCmd())
	return cmd
}

func newPoolPeersCmd() *cobra.Command {
	var f memberFlags
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "List every peer's work and spot-check record",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			peers, err := c.Peers(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(peers)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PEER\tWON\tLOST\tUNITS\tSTREAK\tCHECKED\tFAILED\tSTAMPED\tSTANDING\tSTATUS")
			for _, p := range peers {
				status := "new"
				switch {
				case p.Excluded:
					status = "excluded"
				case p.Trusted(coordinator.SpotParams):
					status = "trusted"
				}
				// Standing: verified results since the last loss or
				// failed check (what a volunteer's result needs to
				// decide a shard of an open pool: coordinator.StandingAfter).
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Peer, p.Won, p.Lost, p.WorkUnits, p.Streak, p.Checked, p.Failed, p.Stamped, p.Standing, status)
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	return cmd
}

func newPoolReadmitCmd() *cobra.Command {
	var f memberFlags
	cmd := &cobra.Command{
		Use:   "readmit PEER",
		Short: "Lift the exclusion of a peer caught by repeated failed checks (operators only)",
		Long: `The peer starts over as a new peer: every shard it runs is re-executed by
another peer until it earns trust again. The request is signed by the
operator's identity (mutual TLS) and applied through the replicated log.`,
		Args: exactArgs(1, "PEER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			resp, err := c.Readmit(ctx, args[0])
			if err != nil {
				return err
			}
			if jsonOutput {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s re-admitted: %d failed check(s) on record, starting over untrusted\n", args[0], resp.Peer.Failed)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
