package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/fl/account"
	"github.com/scellis/scellis/identity"
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
	cmd.AddCommand(newFLLaunchCmd(), newFLWatchCmd(), newFLModelCmd(), newFLSimulateCmd(), newFLListCmd(), newFLStatusCmd(), newFLCancelCmd(), newFLResumeCmd(), newFLPlotCmd())
	return cmd
}

func newFLLaunchCmd() *cobra.Command {
	var f memberFlags
	var watch bool
	var warm string
	cmd := &cobra.Command{
		Use:   "launch RUN.yaml",
		Short: "Launch a training run; prints its ID",
		Example: `  scellis fl launch run.yaml

  # run.yaml
  name: fedprox-hospitals
  strategy: {use: fedprox, params: {mu: 0.1, lr: 0.5, steps: 25, model: logistic}}
  model: {kind: logistic, inputs: 9, label: outcome,
          features: [age, sex, bmi, systolic_bp, glucose, cholesterol, smoker, exercise_hours, prior_admissions]}
  dataset: patients              # the dataset name every silo declares
  rounds: 10
  cohort: {min: 3}               # silos: [...] to name them; default every silo
  privacy: {clip: 1.0, sigma: 1.425, q: 0.04, steps: 25}   # record-level DP-SGD
  standardize: local             # each silo its own statistics
  secure_aggregation: true

  # privacy: σ, q and steps as scellis privacy plan gives them for 800 rows
  # (ε 1 per round, 2.47 for the run). privacy.q is DP-SGD's per-record
  # sampling rate; silos whose dataset is protected at the silo level
  # (unit: silo) are charged q = 1 per round and refuse a q below 1.
  # standardize: federated (the default; needs privacy.feature_bounds, a
  # bound B or a range [lo, hi] per input) and evaluation: {holdout: 0.2}
  # (every: k for one every k rounds too) add a Gaussian release each at
  # q = 1, at privacy.sums_sigma and eval_sigma (else the run's σ: ε ≈ 3.2
  # each at σ 1.425; docs/models.md). scellis privacy plan RUN.yaml plans
  # them all within one budget.`,
		Args: exactArgs(1, "RUN.yaml"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			spec, err := fl.LoadRunSpec(args[0])
			if err != nil {
				return err
			}
			c, fed, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cat, err := openCatalog()
			if err != nil {
				return err
			}
			if warm != "" {
				wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
				spec.WarmStart, err = warmStartModel(wctx, c, warm)
				wcancel()
				if err != nil {
					return err
				}
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
			if canon.TrainerBundle != nil {
				tb, err := canon.TrainerBundle.Encode()
				if err != nil {
					return err
				}
				if tref, err := c.PutBlob(uctx, tb); err != nil {
					return fmt.Errorf("uploading the trainer: %w", err)
				} else if tref != canon.Trainer {
					return fmt.Errorf("the trainer hashes to %s, not %s", tref, canon.Trainer)
				}
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
				return watchRun(ctx, c, fed, resp.Run, cmd.ErrOrStderr())
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the run after launching it")
	cmd.Flags().StringVar(&warm, "warm-start", "", "start from the model of this run's last completed round (same model shape)")
	return cmd
}

func newFLWatchCmd() *cobra.Command {
	cmd := fedIDCommand("watch RUN_ID", "Show a live table of a run's rounds: participants, loss, accuracy, ε per silo, dropouts",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, fed *identity.Federation, id content.Ref) error {
			return watchRun(ctx, c, fed, id, cmd.OutOrStdout())
		})
	cmd.Long = `Watch prints a row per step as it lands and, when the run ends, what it cost
each silo's dataset. Every ε it shows comes from the silos' signed
contribution records of the step's round jobs — a retried round's abandoned
attempts included, each charge once — which privacy report and the Studio
read too (package fl/account).`
	return cmd
}

// printRoundHeader and printRoundRow print the round table of fl watch
// and fl simulate.
func printRoundHeader(w io.Writer) {
	fmt.Fprintln(w, "train: the incoming model on the silos' training rows; held-out: on rows no silo trains on (secure sums)")
	fmt.Fprintf(w, "%5s  %-5s %-5s %8s %8s %8s %8s  %s\n", "round", "step", "sites", "train-ls", "train-ac", "held-ls", "held-ac", "ε charged this round per silo (each silo's ledger composes them) · dropped · absent · declines")
}

func printRoundRow(w io.Writer, row fl.RoundSummary) {
	var eps []string
	for _, s := range slices.Sorted(maps.Keys(row.Epsilon)) {
		eps = append(eps, fmt.Sprintf("%s %.3g", s, row.Epsilon[s]))
	}
	if len(eps) > 8 { // a simulation's thousand sites: one figure per distinct ε
		count := map[string]int{}
		for _, e := range row.Epsilon {
			count[fmt.Sprintf("%.3g", e)]++
		}
		eps = eps[:0]
		for _, e := range slices.Sorted(maps.Keys(count)) {
			eps = append(eps, fmt.Sprintf("%d silos %s", count[e], e))
		}
	}
	extra := ""
	if len(row.Dropped) > 0 {
		extra = " · dropped: " + strings.Join(row.Dropped, ",")
	}
	if len(row.Absent) > 0 {
		extra += " · absent: " + strings.Join(row.Absent, ",")
	}
	for _, s := range sortedKeys(row.Declined) {
		extra += fmt.Sprintf(" · %s declined: %s", s, row.Declined[s])
	}
	train, held := row.Sums["examples"] > 0, row.EvalRows > 0
	fmt.Fprintf(w, "%5d  %-5s %-5d %s %s %s %s  %s%s\n", row.Round, row.Step, len(row.Participants),
		metric(row.TrainLoss, train), metric(row.TrainAcc, train), metric(row.EvalLoss, held), metric(row.EvalAcc, held),
		strings.Join(eps, ", "), extra)
}

// metric prints a mean, or "-" where the step has none.
func metric(v float64, has bool) string {
	if !has {
		return fmt.Sprintf("%8s", "-")
	}
	return fmt.Sprintf("%8.4f", v)
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
	// Privacy is what the run cost each silo's dataset: the account
	// privacy report reads (without its receipt hashes).
	Privacy []account.Dataset `json:"privacy"`
}

// watchRun prints each round as it lands until the run ends. It exits 0
// only when the run is done; a run that stops, or pauses on a failure that
// does not heal by itself, ends the watch with exit code 1, its reason and
// the silos' refusals of the last round. A pause that heals (its silos
// were unreachable) is printed once and watched on: the leader resumes it.
func watchRun(ctx context.Context, c *api.Client, fed *identity.Federation, id content.Ref, w io.Writer) error {
	rd := account.NewReader(poolSource{c}, fed)
	shown := 0
	header := false
	pausedAt := -1 // the attempts when the pause was printed
	for {
		st, err := c.Run(ctx, id)
		if err != nil {
			return err
		}
		if !header && !jsonOutput {
			fmt.Fprintf(w, "run %s (%s): %d steps, cohort %s\n", st.Name, id.Short(), st.Rounds, strings.Join(st.Silos, ", "))
			printRoundHeader(w)
			header = true
		}
		if shown < len(st.Models) {
			steps, err := rd.Steps(ctx, st, shown)
			for _, s := range steps {
				printCheckedStep(w, s.Summary, s.Result.Check)
				shown++
			}
			if err != nil {
				return err
			}
		}
		if st.State != coordinator.RunRunning && !(st.State == coordinator.RunPaused && st.Heals) {
			return endWatch(ctx, rd, st, w)
		}
		if st.State == coordinator.RunPaused && !jsonOutput && pausedAt != len(st.Jobs) {
			// Paused by failures that heal: the run goes on by itself.
			fmt.Fprintf(w, "run paused%s\n  %s\n", reasonSuffix(st.Reason), pausedHint(st))
			pausedAt = len(st.Jobs)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// printCheckedStep prints one step of a live run with how its reduction
// was checked (docs/fl.md, "The cross-checked reduction"): a JSON line
// with "check", or the row and, under it, the nodes that computed it.
func printCheckedStep(w io.Writer, row fl.RoundSummary, chk *fl.ReductionCheck) {
	if jsonOutput {
		b, _ := json.Marshal(struct {
			fl.RoundSummary
			Check *fl.ReductionCheck `json:"check,omitempty"`
		}{row, chk})
		fmt.Fprintln(w, string(b))
		return
	}
	printRoundRow(w, row)
	if chk == nil {
		return
	}
	var nodes []string
	for _, n := range chk.Nodes {
		nodes = append(nodes, n.Node+" "+n.Digest.Short())
	}
	note := ""
	if chk.Note != "" {
		note = ": " + chk.Note
	}
	fmt.Fprintf(w, "%5s  reduction %s (%s)%s\n", "", chk.Mode, strings.Join(nodes, ", "), note)
}

// endWatch reports how a run ended: the final JSON record or a summary,
// with the refusals of the round that did not complete and what the run
// cost each silo's dataset; an error (exit 1) unless the run is done.
func endWatch(ctx context.Context, rd *account.Reader, st coordinator.RunStatus, w io.Writer) error {
	end := runEnd{Final: true, Run: st.ID, State: string(st.State), Reason: st.Reason, Rounds: len(st.Models), Diagnostics: []diag.Diagnostic{}, Privacy: []account.Dataset{}}
	a, err := rd.Run(ctx, st)
	if err != nil {
		return err
	}
	if len(st.Jobs) > len(st.Models) {
		// The round that did not complete: what each silo said of it.
		end.Diagnostics = refusalsIn(a, st.Jobs[len(st.Jobs)-1])
	}
	if a.Datasets != nil {
		end.Privacy = a.Datasets
	}
	if jsonOutput {
		b, _ := json.Marshal(end)
		fmt.Fprintln(w, string(b))
	} else {
		fmt.Fprintf(w, "run %s%s\n", st.State, reasonSuffix(st.Reason))
		for _, d := range end.Diagnostics {
			fmt.Fprintf(w, "  round %d: %s %s: %s\n", len(st.Models), d.Subject, d.Code, d.Message)
		}
		printCost(w, end.Privacy)
	}
	if st.State == coordinator.RunDone {
		return nil
	}
	return &exitError{code: 1, msg: fmt.Sprintf("run %s is %s after %d of %d rounds%s", st.Name, st.State, len(st.Models), st.Rounds, reasonSuffix(st.Reason))}
}

// printCost prints what the run cost each silo's dataset, as privacy
// report does (which adds the receipts): nothing for a run without DP.
func printCost(w io.Writer, ds []account.Dataset) {
	charged := slices.ContainsFunc(ds, func(d account.Dataset) bool { return d.Rounds > 0 })
	if !charged {
		return
	}
	fmt.Fprintln(w, "privacy (each silo's signed records; scellis privacy report adds the receipts):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SILO\tDATASET\tCHARGES\tDECLINED\tRUN ε\tδ\tLEDGER ε\tBUDGET ε")
	for _, d := range ds {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%.4g\t%g\t%.4g\t%g\n", d.Silo, d.Dataset, d.Rounds, d.Declined, d.RunEps, d.Delta, d.LedgerEps, d.Budget)
	}
	tw.Flush()
}

// refusalsIn returns each silo's refusal (declined or failed) of a round
// job as diagnostics whose subject is the silo: codes and their fixed
// titles, never its data.
func refusalsIn(a *account.Run, job content.Ref) []diag.Diagnostic {
	out := []diag.Diagnostic{}
	for _, rec := range a.Records {
		if rec.ReportedTo != job || rec.Status == silo.Contributed {
			continue
		}
		for _, r := range rec.Refusals {
			out = append(out, diag.Diagnostic{Code: r.Code, Severity: diag.Error, Subject: rec.Silo, Message: r.Message})
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

func newFLModelCmd() *cobra.Command {
	var out string
	cmd := fedIDCommand("model RUN_ID --out FILE", "Export a run's latest model as a self-contained model file (docs/models.md)",
		func(ctx context.Context, cmd *cobra.Command, c *api.Client, fed *identity.Federation, id content.Ref) error {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			st, err := c.Run(ctx, id)
			if err != nil {
				return err
			}
			if len(st.Models) == 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("run %s has no completed round yet", st.Name)}
			}
			// The node that answers assembles the file from its replica and
			// signs it; checked here against the federation before it is
			// written, as model verify checks it later.
			b, err := c.RunModel(ctx, id)
			if err != nil {
				return err
			}
			exp, err := fl.ParseModelFile(b, "the model file "+st.Name+" sent")
			if err != nil {
				return err
			}
			if err := checkModelSigner(exp, fed, out); err != nil {
				return err
			}
			if err := job.WriteFileAtomic(out, b); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s model %s of %d inputs (standardisation %s) after %d steps (%s), %d round receipts, signed by %s\n",
				out, exp.Kind, exp.Refs.Model.Short(), exp.Inputs, exp.Standardization.Mode, len(exp.Rounds), exp.Run.State, len(exp.Refs.Receipts), exp.Attestation.Member)
			return nil
		})
	cmd.Flags().StringVar(&out, "out", "model.json", "file to write")
	return cmd
}
