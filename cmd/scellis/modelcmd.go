package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/trainer"
)

func init() { commands = append(commands, newModelCmd) }

func newModelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Score, apply and verify an exported model file",
		Long: `A model file (scellis fl model RUN_ID --out model.json; schema in
docs/models.md) holds everything needed to use the model anywhere: its
shape and parameters, the feature names in order, the label classes and
the standardiser the federation agreed on. Columns are matched by name.
The aggregator node that exported it signed it: model verify checks that
signature, and that the signer is an aggregator of a federation.`,
	}
	cmd.AddCommand(newModelEvalCmd(), newModelPredictCmd(), newModelVerifyCmd())
	return cmd
}

// modelEval is what `model eval` reports.
type modelEval struct {
	Model     string        `json:"model"`
	Data      string        `json:"data"`
	Rows      int           `json:"rows"`
	Accuracy  *float64      `json:"accuracy,omitempty"`
	AUC       *float64      `json:"auc,omitempty"`
	LogLoss   *float64      `json:"log_loss,omitempty"`
	RMSE      *float64      `json:"rmse,omitempty"`
	Classes   []float64     `json:"classes,omitempty"`
	Confusion [][]int       `json:"confusion,omitempty"` // [true class][predicted class]
	Std       string        `json:"standardization"`
	Notes     []string      `json:"notes,omitempty"`
	Metrics   model.Metrics `json:"-"`
	// A trainer run's model is scored by its trainer's evaluate: Loss is
	// the mean of its "loss", TrainerMetrics all it reported.
	Trainer        content.Ref        `json:"trainer,omitempty"`
	Loss           *float64           `json:"loss,omitempty"`
	TrainerMetrics map[string]float64 `json:"trainer_metrics,omitempty"`
}

func newModelEvalCmd() *cobra.Command {
	var (
		data, label, trainerDir string
		tf                      trainerFlags
	)
	cmd := &cobra.Command{
		Use:   "eval MODEL --data test.csv [--label COL] [--trainer DIR]",
		Short: "Score a model file on a labelled CSV: accuracy, AUC, log-loss, confusion matrix, or RMSE",
		Long: `Scores a model file on a labelled CSV. A trainer run's model (kind
trainer) is scored by its trainer's evaluate, run in the sandbox a silo
runs it in: give the trainer's directory with --trainer DIR (the one that
trained it: its content hash must be the model file's).`,
		Example: `  scellis model eval model.json --data test.csv
  scellis --json model eval model.json --data test.csv --label outcome
  scellis model eval model.json --trainer ./cnn --data test.csv`,
		Args: exactArgs(1, "MODEL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := fl.ReadModelFile(args[0])
			if err != nil {
				return err
			}
			if f.Kind == fl.KindTrainer {
				return evalTrainerModel(cmd, &tf, args[0], f, trainerDir, data, label)
			}
			if trainerDir != "" {
				return diag.New(diag.FlagValue, "--trainer", "%s is the model of a built-in %s model, not of a trainer run", args[0], f.Kind).
					WithHelp("drop --trainer: scellis scores a built-in model itself")
			}
			if data == "" {
				return usageError{fmt.Errorf("give the rows to score with --data FILE.csv")}
			}
			if label == "" {
				label = f.Label
			}
			if label == "" {
				return diag.New(diag.FlagValue, "--label", "%s names no label column: its run spec named none, and its silos' records none or different ones", args[0]).
					WithHelp("give the label column with --label COL (a model file exported since records carry the silos' label names it)")
			}
			raw, err := model.LoadCSV(data, label)
			if err != nil {
				return err
			}
			d, err := f.Prepare(raw, data, true)
			if err != nil {
				return err
			}
			m := f.Model()
			met := model.Evaluate(m, d)
			res := modelEval{Model: args[0], Data: data, Rows: met.N, Std: f.Standardization.Mode, Metrics: met}
			if f.Standardization.Mode == fl.StandardizeLocal {
				res.Notes = append(res.Notes, "the run standardised each silo with its own statistics: these rows were standardised with their own")
			}
			if len(f.Classes) == 0 {
				res.RMSE = &met.RMSE
			} else {
				res.Accuracy, res.LogLoss, res.Classes = &met.Accuracy, &met.LogLoss, f.Classes
				if len(f.Classes) == 2 {
					res.AUC = &met.AUC
				}
				res.Confusion = confusion(m, d, len(f.Classes))
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				b, _ := json.MarshalIndent(res, "", "  ")
				fmt.Fprintln(out, string(b))
				return nil
			}
			fmt.Fprintf(out, "%s on %s: %d rows (standardisation %s)\n", args[0], data, res.Rows, res.Std)
			if res.RMSE != nil {
				fmt.Fprintf(out, "rmse      %.4f\n", *res.RMSE)
			} else {
				fmt.Fprintf(out, "accuracy  %.4f\n", *res.Accuracy)
				if res.AUC != nil {
					fmt.Fprintf(out, "auc       %.4f\n", *res.AUC)
				}
				fmt.Fprintf(out, "log-loss  %.4f\n", *res.LogLoss)
				fmt.Fprintln(out, "confusion (rows: true class, columns: predicted)")
				fmt.Fprintf(out, "%8s", "")
				for _, c := range res.Classes {
					fmt.Fprintf(out, " %8v", c)
				}
				fmt.Fprintln(out)
				for i, row := range res.Confusion {
					fmt.Fprintf(out, "%8v", res.Classes[i])
					for _, v := range row {
						fmt.Fprintf(out, " %8d", v)
					}
					fmt.Fprintln(out)
				}
			}
			for _, n := range res.Notes {
				fmt.Fprintf(out, "note: %s\n", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "labelled CSV to score (header row; columns matched by name)")
	cmd.Flags().StringVar(&label, "label", "", "label column (default: the model file's)")
	cmd.Flags().StringVar(&trainerDir, "trainer", "", "a trainer run's model: the trainer's directory, whose evaluate scores it in the sandbox")
	tf.register(cmd)
	return cmd
}

// evalTrainerModel scores a trainer run's model file with its trainer's
// evaluate, in the sandbox (as scellis trainer eval DIR --model FILE
// does), and reports it as model eval reports: rows, accuracy (when the
// trainer counts "correct"), mean loss and all the trainer's sums.
func evalTrainerModel(cmd *cobra.Command, tf *trainerFlags, path string, f *fl.ModelFile, dir, data, label string) error {
	if dir == "" {
		return diag.New(diag.ModelFileBad, path, "the model of a trainer run (trainer %s) is scored by its trainer's evaluate", f.Trainer.Short()).
			WithHelp("give the trainer's directory: scellis model eval %s --trainer DIR --data FILE.csv (scellis trainer check DIR prints its hash)", path)
	}
	abs, label, err := trainerModelData(f, data, label)
	if err != nil {
		return err
	}
	res, err := tf.run(cmd.Context(), dir, trainer.ModeEvaluate, abs, label, path, "", nil)
	if err != nil {
		return err
	}
	rep := modelEval{Model: path, Data: data, Rows: res.Examples, Std: fl.StandardizeNone, Trainer: f.Trainer, TrainerMetrics: res.Metrics}
	if n := res.Metrics["examples"]; n > 0 {
		rep.Rows = int(n)
		if c, ok := res.Metrics["correct"]; ok {
			acc := c / n
			rep.Accuracy = &acc
		}
		if l, ok := res.Metrics["loss"]; ok {
			loss := l / n
			rep.Loss = &loss
		}
	}
	out := cmd.OutOrStdout()
	if jsonOutput {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(out, string(b))
		return nil
	}
	fmt.Fprintf(out, "%s on %s: %d rows, scored by trainer %s (%s) in its sandbox\n", path, data, rep.Rows, dir, f.Trainer.Short())
	if rep.Accuracy != nil {
		fmt.Fprintf(out, "accuracy  %.4f\n", *rep.Accuracy)
	}
	if rep.Loss != nil {
		fmt.Fprintf(out, "loss      %.4f (the trainer's, per row)\n", *rep.Loss)
	}
	for _, k := range keysOf(res.Metrics) {
		fmt.Fprintf(out, "%-9s %g\n", k, res.Metrics[k])
	}
	return nil
}

// predicted returns the class m predicts for each row of d.
func predicted(m *model.Model, d *model.Dataset) ([]int, [][]float64) {
	cls := make([]int, d.Rows())
	probs := make([][]float64, d.Rows())
	for i, out := range m.Predictions(d) {
		p := slices.Clone(out)
		probs[i] = p
		if len(p) == 1 {
			if p[0] >= 0.5 {
				cls[i] = 1
			}
			continue
		}
		for k, v := range p {
			if v > p[cls[i]] {
				cls[i] = k
			}
		}
	}
	return cls, probs
}

func confusion(m *model.Model, d *model.Dataset, k int) [][]int {
	out := make([][]int, k)
	for i := range out {
		out[i] = make([]int, k)
	}
	cls, _ := predicted(m, d)
	for i, c := range cls {
		out[int(d.Y[i])][c]++
	}
	return out
}

func newModelPredictCmd() *cobra.Command {
	var (
		data, out, label, trainerDir string
		tf                           trainerFlags
	)
	cmd := &cobra.Command{
		Use:   "predict MODEL --data X.csv --out preds.csv [--trainer DIR]",
		Short: "Apply a model file to a CSV of features; writes one prediction per row",
		Long: `Applies a model file to a CSV of features and writes one prediction per
row. A trainer run's model (kind trainer) predicts through its trainer, run
in the sandbox a silo runs it in: give the trainer's directory with
--trainer DIR (its content hash must be the model file's). The trainer's
predict (default: the softmax of a torch model's outputs) gives one row of
outputs per data row; the prediction is the index of the largest.`,
		Example: `  scellis model predict model.json --data new-patients.csv --out preds.csv
  scellis model predict model.json --trainer ./cnn --data images.csv --out preds.csv`,
		Args: exactArgs(1, "MODEL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := fl.ReadModelFile(args[0])
			if err != nil {
				return err
			}
			if data == "" || out == "" {
				return usageError{fmt.Errorf("give the rows with --data FILE.csv and where to write with --out FILE.csv")}
			}
			if f.Kind == fl.KindTrainer && trainerDir != "" {
				return predictTrainerModel(cmd, &tf, args[0], f, trainerDir, data, label, out)
			}
			if err := f.ScoredByTrainer(args[0]); err != nil {
				return err
			}
			if trainerDir != "" {
				return diag.New(diag.FlagValue, "--trainer", "%s is the model of a built-in %s model, not of a trainer run", args[0], f.Kind).
					WithHelp("drop --trainer: scellis applies a built-in model itself")
			}
			raw, err := model.LoadFeatures(data)
			if err != nil {
				return err
			}
			d, err := f.Prepare(raw, data, false)
			if err != nil {
				return err
			}
			m := f.Model()
			cls, probs := predicted(m, d)
			var b strings.Builder
			w := csv.NewWriter(&b)
			header := []string{"prediction"}
			switch {
			case len(f.Classes) == 2:
				header = append(header, "p_1")
			case len(f.Classes) > 2:
				for _, c := range f.Classes {
					header = append(header, fmt.Sprintf("p_%v", c))
				}
			}
			w.Write(header)
			for i := range d.Rows() {
				rec := make([]string, 0, len(header))
				if len(f.Classes) == 0 {
					rec = append(rec, strconv.FormatFloat(probs[i][0], 'g', -1, 64))
				} else {
					rec = append(rec, strconv.FormatFloat(f.Classes[cls[i]], 'g', -1, 64))
					for _, p := range probs[i] {
						rec = append(rec, strconv.FormatFloat(p, 'g', -1, 64))
					}
				}
				w.Write(rec)
			}
			w.Flush()
			if err := job.WriteFileAtomic(out, []byte(b.String())); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d predictions to %s\n", d.Rows(), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "CSV of features (header row; columns matched by name; a label column is ignored)")
	cmd.Flags().StringVar(&out, "out", "", "CSV to write: prediction, then class probabilities")
	cmd.Flags().StringVar(&trainerDir, "trainer", "", "a trainer run's model: the trainer's directory, whose predict runs it in the sandbox")
	cmd.Flags().StringVar(&label, "label", "", "with --trainer: the label column the trainer's loader expects (default the model file's, else label); added as zeros when the data has none")
	tf.register(cmd)
	return cmd
}

// trainerModelData is the data file a trainer run's model is applied to
// (its absolute path) and its label column: the flag's, else the model
// file's, else "label".
func trainerModelData(f *fl.ModelFile, data, label string) (string, string, error) {
	abs, err := trainerData(data)
	if label == "" {
		label = f.Label
	}
	if label == "" {
		label = "label"
	}
	return abs, label, err
}

// predictTrainerModel applies a trainer run's model file to the rows of
// data through its trainer's predict, in the sandbox, and writes out: the
// index of each row's largest output, then the outputs (p_0 … p_k-1) when
// there are several. The trainer's loader reads the label column too: a
// data file without it is given one of zeros (a copy, in a folder of its
// own, removed afterwards).
func predictTrainerModel(cmd *cobra.Command, tf *trainerFlags, path string, f *fl.ModelFile, dir, data, label, out string) error {
	abs, label, err := trainerModelData(f, data, label)
	if err != nil {
		return err
	}
	rows, err := withLabelColumn(abs, label)
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(rows.path))
	res, err := tf.run(cmd.Context(), dir, trainer.ModePredict, rows.path, label, path, "", nil)
	if err != nil {
		return err
	}
	if len(res.Predictions) != rows.n {
		return diag.New(diag.TrainerOutput, "trainer "+dir+" (predict)", "%d predictions for the %d rows of %s", len(res.Predictions), rows.n, data).
			WithHelp("the trainer's loader reads every row of the data file, in order")
	}
	var b strings.Builder
	w := csv.NewWriter(&b)
	k := 0
	if len(res.Predictions) > 0 {
		k = len(res.Predictions[0])
	}
	header := []string{"prediction"}
	for c := 0; k > 1 && c < k; c++ {
		header = append(header, fmt.Sprintf("p_%d", c))
	}
	w.Write(header)
	for _, p := range res.Predictions {
		rec := make([]string, 0, len(header))
		if k == 1 {
			rec = append(rec, strconv.FormatFloat(p[0], 'g', -1, 64))
		} else {
			best := 0
			for c := range p {
				if p[c] > p[best] {
					best = c
				}
			}
			rec = append(rec, strconv.Itoa(best))
			for _, v := range p {
				rec = append(rec, strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
		w.Write(rec)
	}
	w.Flush()
	if err := job.WriteFileAtomic(out, []byte(b.String())); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d predictions to %s (trainer %s, %s, in its sandbox)\n", len(res.Predictions), out, dir, f.Trainer.Short())
	return nil
}

// labelledRows is the data file a trainer's predict reads and its row count.
type labelledRows struct {
	path string
	n    int
}

// withLabelColumn copies the CSV at path into a fresh temporary folder,
// adding a label column of zeros when it has none, and counts its rows.
func withLabelColumn(path, label string) (labelledRows, error) {
	in, err := os.Open(path)
	if err != nil {
		return labelledRows{}, diag.New(diag.FileUnreadable, path, "%v", err)
	}
	defer in.Close()
	r := csv.NewReader(in)
	header, err := r.Read()
	if err != nil {
		return labelledRows{}, diag.New(diag.FileUnreadable, path, "no CSV header row: %v", err).WithHelp("give a CSV with a header row")
	}
	add := !slices.Contains(header, label)
	dir, err := os.MkdirTemp("", "scellis-predict-")
	if err != nil {
		return labelledRows{}, err
	}
	rows := labelledRows{path: filepath.Join(dir, filepath.Base(path))}
	fail := func(err error) (labelledRows, error) {
		os.RemoveAll(dir)
		return labelledRows{}, err
	}
	o, err := os.Create(rows.path)
	if err != nil {
		return fail(err)
	}
	w := csv.NewWriter(o)
	if add {
		header = append(header, label)
	}
	if err := w.Write(header); err != nil {
		o.Close()
		return fail(err)
	}
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			o.Close()
			return fail(diag.New(diag.FileUnreadable, path, "row %d: %v", rows.n+1, err))
		}
		if add {
			rec = append(rec, "0")
		}
		if err := w.Write(rec); err != nil {
			o.Close()
			return fail(err)
		}
		rows.n++
	}
	w.Flush()
	if err := w.Error(); err != nil {
		o.Close()
		return fail(err)
	}
	if err := o.Close(); err != nil {
		return fail(err)
	}
	return rows, nil
}
