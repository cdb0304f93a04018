package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
)

func newFLListCmd() *cobra.Command {
	var f memberFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the pool's training runs: ID, name, state, rounds done",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			runs, err := c.Runs(ctx)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if jsonOutput {
				b, _ := json.MarshalIndent(runs, "", "  ")
				printJSON(w, b)
				return nil
			}
			if len(runs) == 0 {
				fmt.Fprintln(w, "no training runs in this pool (scellis fl launch RUN.yaml starts one)")
				return nil
			}
			fmt.Fprintf(w, "%-12s  %-24s %-8s %7s  %s\n", "run", "name", "state", "rounds", "reason")
			for _, r := range runs {
				fmt.Fprintf(w, "%-12s  %-24s %-8s %3d/%-3d  %s\n", r.ID.Short(), r.Name, r.State, len(r.Models), r.Rounds, r.Reason)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newFLStatusCmd() *cobra.Command {
	return idCommand("status RUN_ID", "Show one training run: state, rounds done, cohort, latest model (a linearizable read)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			st, info, err := c.RunNow(ctx, id)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if jsonOutput {
				b, _ := json.MarshalIndent(st, "", "  ")
				printJSON(w, b)
				return nil
			}
			fmt.Fprintf(w, "run %s  %s\n  state %s%s; %d of %d rounds done\n", st.Name, st.ID, st.State, reasonSuffix(st.Reason), len(st.Models), st.Rounds)
			if st.State == coordinator.RunPaused {
				fmt.Fprintf(w, "  %s\n", pausedHint(st))
			}
			fmt.Fprintf(w, "  cohort %s\n", strings.Join(st.Silos, ", "))
			fmt.Fprintf(w, "  %s", startedLine(ctx, c, st))
			if st.DoneAt > 0 {
				fmt.Fprintf(w, ", ended %s", time.UnixMilli(st.DoneAt).UTC().Format(time.RFC3339))
			}
			fmt.Fprintln(w)
			if n := len(st.Models); n > 0 {
				fmt.Fprintf(w, "  latest model: round %d, %s (scellis fl model %s --out model.json)\n", n-1, st.Models[n-1].Short(), st.ID.Short())
			}
			if len(st.Jobs) > len(st.Models) {
				how := "in progress"
				if st.State != coordinator.RunRunning {
					how = "did not complete"
				}
				j := st.Jobs[len(st.Jobs)-1].Short()
				fmt.Fprintf(w, "  round %d %s: job %s (scellis job status %s)\n", len(st.Models), how, j, j)
			}
			fmt.Fprintf(w, "  %s\n", describeRead(info))
			return nil
		})
}

// pausedHint says what becomes of a paused run: the leader resumes one
// paused by failures that heal once enough of its silos are alive (not
// before its retry time); any other waits for a person.
func pausedHint(st coordinator.RunStatus) string {
	if !st.Heals {
		return fmt.Sprintf("it waits for its submitter or an operator: fix the cause, then scellis fl resume %s (or fl cancel it)", st.ID.Short())
	}
	when := "as soon as enough of its silos are alive"
	if d := time.Until(time.UnixMilli(st.RetryAt)); d > 0 {
		when = fmt.Sprintf("once enough of its silos are alive, in %s at the earliest", d.Round(time.Second))
	}
	return fmt.Sprintf("it resumes by itself %s (scellis fl resume %s tries at once)", when, st.ID.Short())
}

// startedLine says when a run started. A run launched before the pool
// kept StartRun's time (it was dropped with the plan's, so every run said
// it started at 0: "1970-01-01") holds no start time in its replicated
// state, nor in snapshots taken since: for it, the submission time of its
// first round job, which the leader planned right after the launch.
func startedLine(ctx context.Context, c *api.Client, st coordinator.RunStatus) string {
	if st.StartedAt > 0 {
		return "started " + time.UnixMilli(st.StartedAt).UTC().Format(time.RFC3339)
	}
	if len(st.Jobs) > 0 {
		if js, err := c.Job(ctx, st.Jobs[0]); err == nil && js.SubmittedAt > 0 {
			return "start time not recorded (launched by an earlier version); first round submitted " + time.UnixMilli(js.SubmittedAt).UTC().Format(time.RFC3339)
		}
	}
	return "start time not recorded (launched by an earlier version)"
}
