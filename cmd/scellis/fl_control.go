package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
)

// fl cancel and fl resume: a run is stopped only by its submitter, an
// operator, or a budget or policy that makes progress impossible; a run
// whose round failed too often is paused, and resume continues it from
// its last completed round's model.

func newFLCancelCmd() *cobra.Command {
	var reason string
	cmd := idCommand("cancel RUN_ID", "Stop a running or paused run for good (its submitter or an operator)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			out, err := c.CancelRun(ctx, id, reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s %s\n", id.Short(), out.State)
			return nil
		})
	cmd.Flags().StringVar(&reason, "reason", "", "why the run is cancelled (recorded with it)")
	return cmd
}

func newFLResumeCmd() *cobra.Command {
	return idCommand("resume RUN_ID", "Continue a paused run from its last completed round (its submitter or an operator)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			out, err := c.ResumeRun(ctx, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "run %s %s\n", id.Short(), out.State)
			return nil
		})
}

// warmStartModel resolves --warm-start RUN: the round result the run's
// last completed round produced.
func warmStartModel(ctx context.Context, c *api.Client, arg string) (content.Ref, error) {
	id, err := resolveID(ctx, c, arg, runID)
	if err != nil {
		return "", err
	}
	st, err := c.Run(ctx, id)
	if err != nil {
		return "", err
	}
	if len(st.Models) == 0 {
		return "", usageError{fmt.Errorf("run %s has no completed round to warm-start from", id.Short())}
	}
	return st.Models[len(st.Models)-1], nil
}
