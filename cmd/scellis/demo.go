package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/datagen"
)

func init() { commands = append(commands, newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var dir string
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show Scellis end to end on this machine",
		Long: `Run the Scellis showcase on this machine.

Today the demo is the solo showcase (a pool of one, no network): it generates
non-IID patient data for four hospitals, runs a learning-rate x L2 sweep of a
logistic-regression model with a heatmap, a Monte Carlo estimate and a 5-fold
cross-validation, each written to result.json with its job ID and content refs.
The federated part (3 aggregator nodes, 4 silos, FedProx with DP and secure
aggregation) joins the demo when the federation lands.`,
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
			fmt.Fprintln(out, "Scellis demo — solo showcase (pool of one: no coordinator, no network).")
			fmt.Fprintln(out, "The federated demo (aggregator cluster + silos) is not built yet; this shows the engine it will run on.")
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
