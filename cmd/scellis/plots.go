package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl/account"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/viz"
)

// The Studio's pictures without a browser: a pool sweep's heatmap and a
// run's curves as PNG files (gonum/plot), drawn from what the pool serves.

func newJobHeatmapCmd() *cobra.Command {
	var out, metric string
	cmd := idCommand("heatmap JOB_ID --out heatmap.png", "Draw a finished pool sweep's heatmap as a PNG",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			st, _, err := c.JobNow(ctx, id)
			if err != nil {
				return err
			}
			if st.Reduced == "" {
				return &exitError{code: 1, msg: fmt.Sprintf("job %s is %s (%d/%d shards verified); the heatmap is drawn from its result — wait for it (scellis job result --wait), or watch it fill in the Studio", st.Name, st.State, st.Counts.Verified, st.Counts.Total)}
			}
			b, err := c.GetBlob(ctx, st.Reduced)
			if err != nil {
				return err
			}
			var doc job.Document
			if err := json.Unmarshal(b, &doc); err != nil {
				return fmt.Errorf("job %s: result document: %w", id.Short(), err)
			}
			var cells []viz.Cell
			for _, s := range doc.Shards {
				if s.Result == "" {
					continue // unverified: never drawn
				}
				rb, err := c.GetBlob(ctx, s.Result)
				if err != nil {
					return err
				}
				var v any
				if err := content.Decode(rb, &v); err != nil {
					return fmt.Errorf("shard %d: result: %w", s.Index, err)
				}
				cells = append(cells, viz.Cell{Params: s.Params, Value: v})
			}
			grid, ok := viz.DetectGrid(cells, metric)
			if !ok {
				return diag.New(diag.BadArguments, id.Short(), "job %s is not a sweep over two parameters whose results hold a numeric metric", st.Name).
					WithHelp("a heatmap needs a grid partitioner with two parameters and results that are dicts of numbers (name one with --metric)")
			}
			if err := grid.PNG(out); err != nil {
				return fmt.Errorf("drawing the heatmap: %w", err)
			}
			if !jsonOutput {
				grid.Terminal(cmd.OutOrStdout())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "  wrote %s\n", out)
			return nil
		})
	cmd.Flags().StringVar(&out, "out", "heatmap.png", "PNG file to write")
	cmd.Flags().StringVar(&metric, "metric", "", "the result's metric to draw (default: auc, accuracy, rmse, log_loss or loss, whichever the results hold)")
	return cmd
}

func newFLPlotCmd() *cobra.Command {
	var out string
	cmd := fedIDCommand("plot RUN_ID --out curves.png", "Draw a run's loss and held-out curves, round by round, as a PNG",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, fed *identity.Federation, id content.Ref) error {
			st, err := c.Run(ctx, id)
			if err != nil {
				return err
			}
			rd := account.NewReader(poolSource{c}, fed)
			spec, err := rd.Spec(ctx, id)
			if err != nil {
				return err
			}
			steps, err := rd.Steps(ctx, st, 0)
			if err != nil {
				return err
			}
			series := map[string]*viz.Series{}
			add := func(name string, round int, v float64) {
				s := series[name]
				if s == nil {
					s = &viz.Series{Name: name}
					series[name] = s
				}
				s.X, s.Y = append(s.X, float64(round)), append(s.Y, v)
			}
			for _, s := range steps {
				row := s.Summary
				if row.Sums["examples"] > 0 {
					add("train loss", row.Round, row.TrainLoss)
				}
				if row.EvalRows > 0 {
					add("held-out loss", row.Round, row.EvalLoss)
					add("held-out accuracy", row.Round, row.EvalAcc)
				}
			}
			pick := func(names ...string) []viz.Series {
				var out []viz.Series
				for _, n := range names {
					if s := series[n]; s != nil {
						out = append(out, *s)
					}
				}
				return out
			}
			left, right := pick("train loss", "held-out loss"), pick("held-out accuracy")
			note := account.CurveNote(&spec.Spec, steps)
			if len(left)+len(right) == 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("run %s has no curve to draw (%d of %d steps done): %s", st.Name, len(st.Models), st.Rounds, note)}
			}
			if err := viz.CurvesPNG(out, fmt.Sprintf("%s: loss by round (%d/%d steps, %s)", st.Name, len(st.Models), st.Rounds, st.State), left, right); err != nil {
				return fmt.Errorf("drawing the curves: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "  wrote %s (%d steps)\n", out, len(st.Models))
			if note != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "  note: %s\n", note)
			}
			return nil
		})
	cmd.Flags().StringVar(&out, "out", "curves.png", "PNG file to write")
	return cmd
}
