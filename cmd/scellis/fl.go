package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/silo"
)

func init() { commands = append(commands, newFLCmd) }

func newFLCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fl",
		Short: "Launch and follow federated training runs",
		Long: `A training run is a chain of round jobs: each round, every silo of the
cohort trains on its own data, clips and noises its update, charges its
privacy ledger and takes part in secure aggregation; the aggregator learns
only the sum and runs the strategy's server step on it.`,
	}
	cmd.AddCommand(newFLLaunchCmd(), newFLWatchCmd(), newFLModelCmd(), newFLListCmd(), newFLStatusCmd())
	return cmd
}

func newFLLaunchCmd() *cobra.Command {
	var f memberFlags
	var watch bool
	cmd := &cobra.Command{
		Use:   "launch RUN.yaml",
		Short: "Launch a training run; prints its ID",
		Example: `  scellis fl launch run.yaml

  # run.yaml
  name: fedprox-hospitals
  strategy: {use: fedprox, params: {mu: 0.1, lr: 0.1, epochs: 1, model: logistic}}
  model: {kind: logistic, inputs: 9}
  dataset: patients              # the dataset name every silo declares
  rounds: 10
  cohort: {min: 3}               # silos: [...] to name them; default every silo
  privacy: {clip: 1.0, sigma: 1.0, q: 1.0}
  secure_aggregation: true`,
		Args: exactArgs(1, "RUN.yaml"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			spec, err := fl.LoadRunSpec(args[0])
			if err != nil {
				return err
			}
			c, _, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cat, err := openCatalog()
			if err != nil {
				return err
			}
			canon, id, strat, err := spec.Resolve(cat, filepath.Dir(args[0]))
			if err != nil {
				return err
			}
			b, err := content.Encode(canon)
			if err != nil {
				return err
			}
			uctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			ref, err := c.PutBlob(uctx, b)
			if err != nil {
				return fmt.Errorf("uploading the run spec: %w", err)
			}
			if ref != id {
				return fmt.Errorf("the run spec hashes to %s, not %s", ref, id)
			}
			req := api.RunRequest{Spec: ref}
			builtin, err := catalog.Builtin()
			if err != nil {
				return err
			}
			if _, isBuiltin := builtin.Lookup(string(strat.Entry.Ref)); !isBuiltin {
				if _, err := c.PutBlob(uctx, strat.Entry.Source); err != nil {
					return fmt.Errorf("uploading the strategy: %w", err)
				}
				req.Strategy = strat.Entry.Ref
			}
			resp, err := c.StartRun(uctx, req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Run)
			if resp.Existing {
				// The same spec is the same run: say where it stands
				// rather than pretend to launch it again.
				st, _, err := c.RunNow(uctx, resp.Run)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "run %s (%s) was already launched and is %s: %d of %d rounds done%s; nothing changed\n",
					spec.Name, resp.Run.Short(), st.State, len(st.Models), st.Rounds, reasonSuffix(st.Reason))
				switch {
				case st.State == coordinator.RunDone:
					fmt.Fprintf(cmd.ErrOrStderr(), "scellis: hint: scellis fl model %s exports its model; change the spec (name, rounds, seed) to train again\n", resp.Run.Short())
					return nil
				case st.State != coordinator.RunRunning:
					return nil
				}
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "launched %s: %d rounds of %s on dataset %q\n", spec.Name, spec.Rounds, strat.Entry.Name, spec.Dataset)
			}
			if watch {
				return watchRun(ctx, c, resp.Run, cmd.ErrOrStderr())
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the run after launching it")
	return cmd
}

func newFLWatchCmd() *cobra.Command {
	return idCommand("watch RUN_ID", "Show a live table of a run's rounds: participants, loss, accuracy, ε per silo, dropouts",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			return watchRun(ctx, c, id, cmd.OutOrStdout())
		})
}

// roundRow is one line of the watch table.
type roundRow struct {
	Round        int                `json:"round"`
	Participants []string           `json:"participants"`
	Dropped      []string           `json:"dropped"`
	Loss         float64            `json:"loss"`
	Accuracy     float64            `json:"accuracy"`
	Epsilon      map[string]float64 `json:"epsilon"` // ε charged this round, per silo
	Declined     map[string]string  `json:"declined,omitempty"`
	Model        content.Ref        `json:"model"`
}

// roundRowOf reads a completed round: its result document and the silos'
// signed contribution records (the round job's reported results).
func roundRowOf(ctx context.Context, c *api.Client, jobID, model content.Ref) (roundRow, error) {
	raw, err := c.GetBlob(ctx, model)
	if err != nil {
		return roundRow{}, err
	}
	rr, _, err := fl.DecodeRoundResult(raw)
	if err != nil {
		return roundRow{}, err
	}
	row := roundRow{Round: rr.Round, Participants: rr.Participants, Dropped: rr.Dropped, Epsilon: map[string]float64{}, Declined: map[string]string{}, Model: rr.Model}
	if n := rr.Metrics["examples"]; n > 0 {
		row.Loss = rr.Metrics["loss"] / n
		row.Accuracy = rr.Metrics["correct"] / n
	}
	st, err := c.Job(ctx, jobID)
	if err != nil {
		return row, nil
	}
	for _, s := range st.Shards {
		if s.Result == "" {
			continue
		}
		b, err := c.GetBlob(ctx, s.Result)
		if err != nil {
			continue
		}
		sc, err := silo.DecodeContribution(b)
		if err != nil {
			continue
		}
		switch sc.Record.Status {
		case silo.Contributed:
			row.Epsilon[sc.Record.Silo] = sc.Record.Epsilon
		default:
			reason := sc.Record.Status
			if len(sc.Record.Refusals) > 0 {
				reason = fmt.Sprintf("%s %s", sc.Record.Refusals[0].Code, sc.Record.Refusals[0].Message)
			}
			row.Declined[sc.Record.Silo] = reason
		}
	}
	return row, nil
}

// runEnd is the last record of `fl watch --json`: how the run ended and,
// when a round failed, every silo's refusal of it.
type runEnd struct {
	Final       bool              `json:"final"`
	Run         content.Ref       `json:"run"`
	State       string            `json:"state"`
	Reason      string            `json:"reason,omitempty"`
	Rounds      int               `json:"rounds_completed"`
	Diagnostics []diag.Diagnostic `json:"diagnostics"`
}

// watchRun prints each round as it lands until the run ends. It exits 0
// only when the run is done; a run that stops or pauses ends the watch
// with exit code 1, its reason and the silos' refusals of the last round.
func watchRun(ctx context.Context, c *api.Client, id content.Ref, w io.Writer) error {
	shown := 0
	header := false
	for {
		st, err := c.Run(ctx, id)
		if err != nil {
			return err
		}
		if !header && !jsonOutput {
			fmt.Fprintf(w, "run %s (%s): %d rounds, cohort %s\n", st.Name, id.Short(), st.Rounds, strings.Join(st.Silos, ", "))
			fmt.Fprintf(w, "%5s  %-6s %8s %8s  %s\n", "round", "sites", "loss", "acc", "ε charged this round per silo (each silo's ledger composes them) · dropouts · declines")
			header = true
		}
		for ; shown < len(st.Models); shown++ {
			row, err := roundRowOf(ctx, c, st.Jobs[shown], st.Models[shown])
			if err != nil {
				return err
			}
			if jsonOutput {
				b, _ := json.Marshal(row)
				fmt.Fprintln(w, string(b))
				continue
			}
			var eps []string
			silos := make([]string, 0, len(row.Epsilon))
			for s := range row.Epsilon {
				silos = append(silos, s)
			}
			sort.Strings(silos)
			for _, s := range silos {
				eps = append(eps, fmt.Sprintf("%s %.3g", s, row.Epsilon[s]))
			}
			extra := ""
			if len(row.Dropped) > 0 {
				extra = " · dropped: " + strings.Join(row.Dropped, ",")
			}
			for _, s := range sortedKeys(row.Declined) {
				extra += fmt.Sprintf(" · %s declined: %s", s, row.Declined[s])
			}
			fmt.Fprintf(w, "%5d  %-6d %8.4f %8.4f  %s%s\n", row.Round, len(row.Participants), row.Loss, row.Accuracy, strings.Join(eps, ", "), extra)
		}
		if st.State != coordinator.RunRunning {
			return endWatch(ctx, c, st, w)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// endWatch reports how a run ended: the final JSON record or a summary,
// with the refusals of the round that did not complete; an error (exit 1)
// unless the run is done.
func endWatch(ctx context.Context, c *api.Client, st coordinator.RunStatus, w io.Writer) error {
	end := runEnd{Final: true, Run: st.ID, State: string(st.State), Reason: st.Reason, Rounds: len(st.Models), Diagnostics: []diag.Diagnostic{}}
	if len(st.Jobs) > len(st.Models) {
		// The round that did not complete: what each silo said of it.
		end.Diagnostics = roundRefusals(ctx, c, st.Jobs[len(st.Jobs)-1])
	}
	if jsonOutput {
		b, _ := json.Marshal(end)
		fmt.Fprintln(w, string(b))
	} else {
		fmt.Fprintf(w, "run %s%s\n", st.State, reasonSuffix(st.Reason))
		for _, d := range end.Diagnostics {
			fmt.Fprintf(w, "  round %d: %s %s: %s\n", len(st.Models), d.Subject, d.Code, d.Message)
		}
	}
	if st.State == coordinator.RunDone {
		return nil
	}
	return &exitError{code: 1, msg: fmt.Sprintf("run %s is %s after %d of %d rounds%s", st.Name, st.State, len(st.Models), st.Rounds, reasonSuffix(st.Reason))}
}

// roundRefusals reads a round job's signed contribution records and
// returns each silo's refusal (declined or failed) as diagnostics whose
// subject is the silo: codes and their fixed titles, never its data.
func roundRefusals(ctx context.Context, c *api.Client, job content.Ref) []diag.Diagnostic {
	out := []diag.Diagnostic{}
	js, err := c.Job(ctx, job)
	if err != nil {
		return out
	}
	for _, s := range js.Shards {
		if s.Result == "" {
			continue
		}
		b, err := c.GetBlob(ctx, s.Result)
		if err != nil {
			continue
		}
		sc, err := silo.DecodeContribution(b)
		if err != nil || sc.Record.Status == silo.Contributed {
			continue
		}
		for _, r := range sc.Record.Refusals {
			out = append(out, diag.Diagnostic{Code: r.Code, Severity: diag.Error, Subject: sc.Record.Silo, Message: r.Message})
		}
	}
	return out
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// modelExport is what `fl model` writes: the final model and the
// provenance that lets anyone check where it came from.
type modelExport struct {
	Format   string         `json:"format"`
	Run      content.Ref    `json:"run"`
	Name     string         `json:"name"`
	State    string         `json:"state"`
	Rounds   []content.Ref  `json:"round_results"` // round result documents, in order
	Jobs     []content.Ref  `json:"round_jobs"`
	Strategy content.Ref    `json:"strategy"`
	Model    content.Ref    `json:"model"`
	Global   map[string]any `json:"global"`
	Receipts []content.Ref  `json:"receipts"`
}

func newFLModelCmd() *cobra.Command {
	var out string
	cmd := idCommand("model RUN_ID --out FILE", "Export a run's latest model with its provenance (content refs, round receipts)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			st, err := c.Run(ctx, id)
			if err != nil {
				return err
			}
			if len(st.Models) == 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("run %s has no completed round yet", st.Name)}
			}
			raw, err := c.GetBlob(ctx, st.Models[len(st.Models)-1])
			if err != nil {
				return err
			}
			rr, g, err := fl.DecodeRoundResult(raw)
			if err != nil {
				return err
			}
			exp := modelExport{Format: "scellis/model/v1", Run: id, Name: st.Name, State: string(st.State), Rounds: st.Models,
				Jobs: st.Jobs, Strategy: rr.Strategy, Model: rr.Model, Global: g}
			receipts, err := c.Receipts(ctx, 0)
			if err == nil {
				jobs := map[content.Ref]bool{}
				for _, j := range st.Jobs {
					jobs[j] = true
				}
				for _, r := range receipts {
					if jobs[r.Job] {
						exp.Receipts = append(exp.Receipts, r.Hash)
					}
				}
			}
			b, err := json.MarshalIndent(exp, "", "  ")
			if err != nil {
				return err
			}
			if err := job.WriteFileAtomic(out, append(b, '\n')); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: model %s after %d rounds (%s), %d round receipts\n", out, rr.Model.Short(), len(st.Models), st.State, len(exp.Receipts))
			return nil
		})
	cmd.Flags().StringVar(&out, "out", "model.json", "file to write")
	return cmd
}
