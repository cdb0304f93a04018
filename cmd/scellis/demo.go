package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/datagen"
)

func init() { commands = append(commands, newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var dir string
	var keep, solo, stay bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show Scellis end to end on this machine",
		Long: `Run the Scellis showcase on this machine.

The demo starts a whole federation as child processes on loopback: 3
aggregator nodes (Raft) and 4 hospital silos, each with its own non-IID
patient data, privacy ledger and policy. It runs FedProx with update-level
differential privacy and secure aggregation, kills one silo mid-run (the
rounds go on with three), prints each hospital's ledger, verifies the receipt
chain, and runs a sweep on the same pool. It prints the URL of the Studio,
the live web view, where the run's loss curve, each hospital's (ε, δ) and the
sweep's heatmap appear as they land (--stay keeps it up after the demo). It
cleans up its processes.

--solo runs the solo showcase instead (a pool of one, no network): a sweep
with a heatmap, a Monte Carlo estimate and a k-fold cross-validation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			out := cmd.OutOrStdout()
			if dir == "" {
				d, err := os.MkdirTemp("", "scellis-demo-")
				if err != nil {
					return err
				}
				dir = d
				if !keep {
					defer os.RemoveAll(d)
				}
			}
			if !solo {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				fmt.Fprintln(out, "Scellis demo — a federation on this machine (use --solo for the pool-of-one showcase)")
				start := time.Now()
				d := &federationDemo{dir: dir, out: out, exe: exe, procs: map[string]*exec.Cmd{}, exited: map[string]chan struct{}{}, stay: stay}
				err = d.run(ctx)
				d.stopAll()
				if err != nil {
					return fmt.Errorf("%w (logs in %s; run with --dir DIR --keep to keep them)", err, d.path("logs"))
				}
				fmt.Fprintf(out, "\ndone in %s; processes stopped", time.Since(start).Round(time.Second))
				if keep {
					fmt.Fprintf(out, "; state kept in %s\n", dir)
				} else {
					fmt.Fprintln(out, "; run with --dir DIR --keep to inspect configs, logs, ledgers and results")
				}
				return nil
			}
			fmt.Fprintln(out, "Scellis demo — solo showcase (pool of one: no coordinator, no network).")
			fmt.Fprintln(out)

			dataDir := filepath.Join(dir, "data")
			sites, err := datagen.Hospitals(4, 1500, 7)
			if err != nil {
				return err
			}
			paths, err := datagen.WriteHospitals(dataDir, sites)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "1. generated non-IID patient records for %d hospitals in %s\n\n", len(paths), dataDir)

			jobs := []struct{ title, file, body string }{
				{"2. sweep: learning rate × L2 for logistic regression on hospital 1 (train-eval, grid)", "sweep.yaml", demoSweep},
				{"3. Monte Carlo: estimate pi from 4 million samples in 16 shards (montecarlo-pi, range)", "montecarlo.yaml", demoMonteCarlo},
				{"4. 5-fold stratified cross-validation of the chosen model (train-eval, kfold)", "kfold.yaml", demoKFold},
			}
			for _, j := range jobs {
				fmt.Fprintln(out, j.title)
				path := filepath.Join(dir, j.file)
				if err := os.WriteFile(path, []byte(j.body), 0o644); err != nil {
					return err
				}
				o := runOptions{out: filepath.Join(dir, "out", j.file[:len(j.file)-len(".yaml")])}
				if _, err := runJob(ctx, path, o, out, cmd.ErrOrStderr()); err != nil {
					return err
				}
				fmt.Fprintln(out)
			}
			if keep {
				fmt.Fprintf(out, "state kept in %s\n", dir)
			} else {
				fmt.Fprintln(out, "done; that folder was temporary and is now removed: run with --dir DIR --keep to inspect the data, job files and results")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "folder for the demo's data and results (default: a temporary folder)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the demo folder afterwards")
	cmd.Flags().BoolVar(&stay, "stay", false, "keep the federation and its Studio (the live web view) up after the demo, until Ctrl-C")
	cmd.Flags().BoolVar(&solo, "solo", false, "run the solo showcase (no processes, no network) instead of the federation")
	return cmd
}

const demoSweep = `name: hospital-sweep
description: learning rate x L2 for logistic regression, held-out AUC
program: train-eval
partitioner:
  use: grid
  params:
    lr: [0.01, 0.03, 0.1, 0.3]
    l2: [0.0, 0.001, 0.01, 0.1]
reducer:
  use: collect
  params: {metric: auc, goal: max}
params: {model: logistic, epochs: 5, batch_size: 32, test_frac: 0.25, seed: 1}
inputs:
  data: {path: data/hospital-1.csv, label: outcome, class: confidential}
`

const demoMonteCarlo = `name: montecarlo-pi
program: montecarlo-pi
partitioner:
  use: range
  params: {start: 0, count: 4000000, chunks: 16}
reducer:
  use: mean
  params: {weight: samples}
`

const demoKFold = `name: hospital-kfold
program: train-eval
partitioner:
  use: kfold
  params: {k: 5}
reducer: mean
params: {model: logistic, epochs: 5, batch_size: 32, lr: 0.1, l2: 0.001, seed: 1}
inputs:
  data: {path: data/hospital-1.csv, label: outcome, class: confidential}
`
