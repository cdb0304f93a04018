package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/trust"
)

func init() { commands = append(commands, newJobCmd) }

func newJobCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Submit jobs to a pool and follow them",
		Long: `Submit a job to a pool of workers coordinated by the aggregator cluster,
watch its progress (shards/s, ETA), and fetch its result.json (the same
document a solo run writes, plus the receipts of the verified shards).`,
	}
	cmd.AddCommand(newJobSubmitCmd(), newJobWatchCmd(), newJobStatusCmd(), newJobResultCmd(), newJobListCmd(), newJobCancelCmd(), newJobHeatmapCmd())
	return cmd
}

func newJobSubmitCmd() *cobra.Command {
	var f memberFlags
	var watch bool
	cmd := &cobra.Command{
		Use:   "submit JOB.yaml",
		Short: "Submit a job; prints its ID",
		Long: `Compile the job locally (the same checks and job ID as 'scellis run'),
upload its bundle, content and inputs to the pool's blob store, and submit
it. The aggregator re-plans the job itself: shard prices come from the
content, never from the submitter. Prints the job ID on stdout; with
--watch, then follows the job on stderr as 'scellis job watch' does.`,
		Example: "  scellis job submit examples/sweep/job.yaml --pool 127.0.0.1:7400",
		Args:    exactArgs(1, "JOB.yaml"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			c, fed, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			spec, err := job.LoadSpec(args[0])
			if err != nil {
				return err
			}
			cat, err := openCatalog()
			if err != nil {
				return err
			}
			plan, err := job.Compile(ctx, spec, cat)
			if err != nil {
				return err
			}
			// Refuse early what the pool would refuse; the pool checks again.
			if ds := trust.Admit(fed.Regime, plan.AdmissionRequest()); ds.HasErrors() {
				return ds
			}
			sources, inputs := plan.Blobs()
			uctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			for ref, src := range sources {
				if _, err := c.PutBlob(uctx, src); err != nil {
					return fmt.Errorf("uploading content %s: %w", ref.Short(), err)
				}
			}
			for ref, path := range inputs {
				b, err := safefile.ReadFile(path, safefile.MaxDataset)
				if err != nil {
					return err
				}
				if content.Hash(b) != ref {
					return fmt.Errorf("input %s changed while submitting", path)
				}
				if _, err := c.PutBlob(uctx, b); err != nil {
					return fmt.Errorf("uploading input %s: %w", filepath.Base(path), err)
				}
			}
			bundle, err := content.Encode(plan.Bundle())
			if err != nil {
				return err
			}
			bref, err := c.PutBlob(uctx, bundle)
			if err != nil {
				return fmt.Errorf("uploading the bundle: %w", err)
			}
			resp, err := c.Submit(uctx, bref)
			if err != nil {
				return err
			}
			if resp.Job != plan.ID {
				return fmt.Errorf("the pool planned job %s, but this job is %s", resp.Job, plan.ID)
			}
			if jsonOutput {
				b, _ := json.Marshal(resp)
				printJSON(cmd.OutOrStdout(), b)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), resp.Job)
				again := ""
				if resp.Existing {
					again = " (already submitted; nothing changed)"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "submitted %s: %d shards, %d work units, verification %s%s\n",
					spec.Name, resp.Shards, plan.TotalCost(), resp.Method, again)
			}
			if watch {
				return watchJob(ctx, c, resp.Job, cmd.ErrOrStderr())
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the job's progress after submitting (on stderr, as job watch does)")
	return cmd
}

func newJobWatchCmd() *cobra.Command {
	cmd := idCommand("watch JOB_ID", "Follow a job live: progress, shards/s, ETA, and the events that matter",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			return watchJob(ctx, c, id, cmd.OutOrStdout())
		})
	cmd.Long = `Follow a job until it completes. A progress line gives the shards decided
(verified and unverified) of the total, shards/s over the last 10 s and
overall, an ETA, and the leases granted, handed back, lapsed and revoked
since the line before. On a terminal the line is redrawn in place every
second (its leases: those of the last 10 s); otherwise (a log, a pipe) a
line is written every 5 s, less often as the job runs on (every tenth of
the time so far, at most a minute), so a log stays tens of lines long.

Lines of their own: a shard unverified, a shard whose verification
out-voted a peer, a late report that disagrees, a peer caught or excluded,
a shard reopened or a receipt reversed by a spot check, all shards
decided, the job cancelled, the reduction. More than 5 of one kind within
5 s are counted on one line. The last line gives the wall time, the mean
shards/s and the leases seen:

  done in 16.3s: 200/200 shards decided (200 verified, 0 unverified), 12.3 shards/s mean; leases: 203 granted, 3 lapsed

With --json, every event of the stream as one JSON object a line.`
	cmd.Example = "  scellis job watch 3f2a9c1e5b7d\n  scellis job submit examples/sweep/job.yaml --watch"
	return cmd
}

func newJobStatusCmd() *cobra.Command {
	cmd := idCommand("status JOB_ID", "Show a job's state and shard counts",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			st, info, err := c.JobNow(ctx, id)
			if err != nil {
				return err
			}
			if jsonOutput {
				b, _ := json.MarshalIndent(st, "", "  ")
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "job %s  %s\n  state %s; regime %s; verification %s\n", st.Name, st.ID, st.State, st.Regime, st.Method)
			if st.Submitter != "" {
				fmt.Fprintf(out, "  submitted by %s\n", st.Submitter)
			}
			fmt.Fprintf(out, "  shards: %d total, %d verified, %d unverified, %d leased, %d pending\n",
				st.Counts.Total, st.Counts.Verified, st.Counts.Unverified, st.Counts.Leased, st.Counts.Pending)
			if st.Reduced != "" {
				fmt.Fprintf(out, "  result %s (scellis job result %s --out DIR)\n", st.Reduced, st.ID)
			}
			fmt.Fprintf(out, "  %s\n", describeRead(info))
			return nil
		})
	return cmd
}

func newJobResultCmd() *cobra.Command {
	var out string
	var wait bool
	cmd := idCommand("result JOB_ID --out DIR", "Fetch a finished job's result.json",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			if wait {
				if err := c.Watch(ctx, id, func(api.Event) error { return nil }); err != nil {
					return err
				}
			}
			// A linearizable read: after the stream's job-complete it sees
			// the reduction, whichever node streamed it.
			st, _, err := c.JobNow(ctx, id)
			if err != nil {
				return err
			}
			if st.Reduced == "" {
				return &exitError{code: 1, msg: fmt.Sprintf("job %s is %s (%d/%d shards verified); no result yet — use --wait, or scellis job watch %s", st.Name, st.State, st.Counts.Verified, st.Counts.Total, id)}
			}
			b, err := c.GetBlob(ctx, st.Reduced)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			path := filepath.Join(out, "result.json")
			if err := job.WriteFileAtomic(path, b); err != nil {
				return err
			}
			if jsonOutput {
				cmd.OutOrStdout().Write(b)
				return nil
			}
			var doc job.Document
			if err := json.Unmarshal(b, &doc); err == nil {
				printSummary(cmd.OutOrStdout(), &doc)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "  wrote %s\n", path)
			return nil
		})
	cmd.Flags().StringVar(&out, "out", ".", "folder to write result.json into")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the job to complete first")
	return cmd
}

func newJobListCmd() *cobra.Command {
	var f memberFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the pool's jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			jobs, err := c.Jobs(ctx)
			if err != nil {
				return err
			}
			if jsonOutput {
				b, _ := json.MarshalIndent(jobs, "", "  ")
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			for _, j := range jobs {
				fmt.Fprintf(cmd.OutOrStdout(), "%s  %-20s %-9s %d/%d verified\n", j.ID, j.Name, j.State, j.Counts.Verified, j.Counts.Total)
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newJobCancelCmd() *cobra.Command {
	var reason string
	cmd := idCommand("cancel JOB_ID", "Cancel a job that has not been reduced (its open shards are flagged, its leases revoked)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			resp, err := c.Cancel(ctx, id, reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "job %s %s; %d open shard(s) flagged\n", id.Short(), resp.State, len(resp.Flagged))
			return nil
		})
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the job's event stream and status")
	return cmd
}
