package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/trainer"
)

func init() { commands = append(commands, newTrainerCmd) }

func newTrainerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trainer",
		Short: "Check, initialise and try out a trainer: your own training program, run in the silos",
		Long: `A trainer is a directory of Python files with an entry point (train.py)
that a run names (trainer: DIR in RUN.yaml). Each silo whose policy allows
it by content hash runs it in a sandbox on its own data; the silo clips,
noises, charges and masks the update it returns (docs/trainers.md).

These commands run the trainer exactly as a silo would: in the same
sandbox, with the same file protocol and the same helper module.`,
	}
	cmd.AddCommand(newTrainerCheckCmd(), newTrainerInitCmd(), newTrainerTrainCmd(), newTrainerEvalCmd(), newTrainerExportCmd(), newTrainerHelperCmd())
	return cmd
}

// trainerFlags are the sandbox settings of the commands that run a trainer.
type trainerFlags struct {
	interpreter string
	cpu, memory int
	wall        time.Duration
}

func (f *trainerFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.interpreter, "interpreter", "/usr/bin/python3", "interpreter that runs the entry point, as a silo's policy names it")
	cmd.Flags().IntVar(&f.cpu, "cpu-seconds", trainer.DefaultLimits.CPUSeconds, "CPU-time limit (policy.trainers cpu_seconds)")
	cmd.Flags().IntVar(&f.memory, "memory-mb", trainer.DefaultLimits.MemoryMB, "address-space limit in MiB (policy.trainers memory_mb)")
	cmd.Flags().DurationVar(&f.wall, "wall", trainer.DefaultLimits.Wall, "wall-clock limit (policy.trainers wall)")
	// As policy.trainers takes them: at least 1 (a day of CPU, 1 TiB at most).
	flagRange(cmd, "cpu-seconds", "1", "86400")
	flagRange(cmd, "memory-mb", "1", "1048576")
}

func (f *trainerFlags) job(b *trainer.Bundle, mode string) trainer.Job {
	return trainer.Job{Interpreter: f.interpreter, Bundle: b, Mode: mode, Dir: os.TempDir(),
		Limits: trainer.Limits{CPUSeconds: f.cpu, MemoryMB: f.memory, Wall: f.wall}}
}

// run runs the trainer of dir in mode, in its sandbox, on the data file
// (an absolute path) from the weights of a model file or an .npy (default
// the trainer's init.npy): what trainer train, trainer eval and model
// eval share.
func (f *trainerFlags) run(ctx context.Context, dir, mode, data, label, model, wfile string, params map[string]any) (trainer.Result, error) {
	b, err := trainer.Load(dir)
	if err != nil {
		return trainer.Result{}, err
	}
	w, layout, err := startWeights(b, model, wfile)
	if err != nil {
		return trainer.Result{}, err
	}
	j := f.job(b, mode)
	j.Data, j.Label, j.Weights, j.Layout, j.Params = data, label, w, layout, params
	return trainer.Run(ctx, j)
}

// trainerCheck is what `trainer check` reports.
type trainerCheck struct {
	Dir      string         `json:"dir"`
	Hash     content.Ref    `json:"hash"`
	Entry    string         `json:"entry"`
	Files    []string       `json:"files"`
	Bytes    int            `json:"bytes"`
	Layout   trainer.Layout `json:"layout,omitempty"`
	Params   int            `json:"params,omitempty"`
	Problems diag.List      `json:"problems,omitempty"`
	Warnings []string       `json:"warnings,omitempty"`
	Policy   map[string]any `json:"policy"`
}

func newTrainerCheckCmd() *cobra.Command {
	var interpreter string
	cmd := &cobra.Command{
		Use:   "check DIR",
		Short: "Print a trainer's content hash and what a silo will see; check its entry point and initial weights",
		Long: `Check reads DIR as a run ships it (every file except dot-files and
__pycache__), prints its content hash — what a silo's operator lists under
policy.trainers — its files, its entry point and its model's layout, and
checks statically: the entry point exists, every .py file parses (the
interpreter's ast module: nothing is executed), the entry point imports
scellis_trainer, no file shadows the helper the silo provides, and init.npy
agrees with layout.json (scellis trainer init DIR writes both). Problems
exit 2.`,
		Example: "  scellis trainer check ./cnn",
		Args:    exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := trainer.Load(args[0])
			if err != nil {
				return err
			}
			ref, err := b.Ref()
			if err != nil {
				return err
			}
			rep := trainerCheck{Dir: args[0], Hash: ref, Entry: b.Entry}
			for _, f := range b.Files {
				rep.Files = append(rep.Files, f.Path)
				rep.Bytes += len(f.Data)
			}
			if _, ok := b.File(trainer.HelperModule); ok {
				rep.Warnings = append(rep.Warnings, trainer.HelperModule+" is in the trainer: it shadows the helper the silo provides; remove it (scellis trainer helper prints the silo's for local use)")
			}
			if src, _ := b.File(b.Entry); !strings.Contains(string(src), "scellis_trainer") {
				rep.Warnings = append(rep.Warnings, b.Entry+" does not import scellis_trainer: it must read and write the file protocol itself (docs/trainers.md)")
			}
			if w, l, err := b.Init(); err != nil {
				ds, _ := diag.As(err)
				rep.Problems = append(rep.Problems, ds...)
			} else {
				rep.Layout, rep.Params = l, len(w)
			}
			rep.Problems = append(rep.Problems, syntaxCheck(cmd.Context(), interpreter, b)...)
			rep.Policy = map[string]any{"name": filepath.Base(filepath.Clean(args[0])), "hash": string(ref), "interpreter": interpreter}
			out := cmd.OutOrStdout()
			if jsonOutput {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printTrainerCheck(out, rep)
			}
			if len(rep.Problems) > 0 {
				if jsonOutput {
					return &exitError{code: 2, msg: ""}
				}
				return rep.Problems
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&interpreter, "interpreter", "/usr/bin/python3", "interpreter whose parser checks the .py files (and that the policy snippet names)")
	return cmd
}

func printTrainerCheck(w io.Writer, rep trainerCheck) {
	fmt.Fprintf(w, "trainer %s\n", rep.Dir)
	fmt.Fprintf(w, "hash      %s\n", rep.Hash)
	fmt.Fprintf(w, "entry     %s\n", rep.Entry)
	fmt.Fprintf(w, "files     %d (%d bytes): %s\n", len(rep.Files), rep.Bytes, strings.Join(rep.Files, " "))
	if rep.Params > 0 {
		fmt.Fprintf(w, "model     %d weights in %d tensors\n", rep.Params, len(rep.Layout))
		for _, t := range rep.Layout {
			fmt.Fprintf(w, "  %-24s %v\n", t.Name, t.Shape)
		}
	}
	fmt.Fprintln(w, "a silo sees: /trainer (these files, read-only), /data/FILE (its dataset, read-only), /scratch and /io (writable), no network")
	for _, s := range rep.Warnings {
		fmt.Fprintf(w, "warning: %s\n", s)
	}
	fmt.Fprintln(w, "a silo that reviewed this trainer allows it with (silo config):")
	fmt.Fprintf(w, "  policy:\n    trainers:\n      - name: %s\n        hash: %s\n        interpreter: %s\n        cpu_seconds: %d\n        memory_mb: %d\n        wall: %v\n",
		rep.Policy["name"], rep.Hash, rep.Policy["interpreter"], trainer.DefaultLimits.CPUSeconds, trainer.DefaultLimits.MemoryMB, trainer.DefaultLimits.Wall)
}

// syntaxCheck parses every .py file of the bundle with the interpreter's
// ast module (nothing runs): a syntax error is SC9501 at file:line.
func syntaxCheck(ctx context.Context, interpreter string, b *trainer.Bundle) diag.List {
	if _, err := os.Stat(interpreter); err != nil {
		return diag.List{diag.New(diag.TrainerBad, "trainer", "interpreter %s is not there to check the Python files: %v", interpreter, err).
			WithHelp("install Debian's python3 (with python3-numpy and python3-torch), or name it with --interpreter")}
	}
	const script = `import ast, json, sys
out = []
for path, src in json.load(sys.stdin):
    try:
        ast.parse(src, path)
    except SyntaxError as e:
        out.append([path, e.lineno or 0, e.offset or 0, e.msg])
json.dump(out, sys.stdout)`
	var files [][2]string
	for _, f := range b.Files {
		if strings.HasSuffix(f.Path, ".py") {
			files = append(files, [2]string{f.Path, string(f.Data)})
		}
	}
	in, _ := json.Marshal(files)
	cmd := exec.CommandContext(ctx, interpreter, "-I", "-c", script)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		return diag.List{diag.New(diag.TrainerBad, "trainer", "checking the Python files with %s: %v", interpreter, err)}
	}
	var found [][4]any
	if err := json.Unmarshal(out, &found); err != nil {
		return diag.List{diag.New(diag.TrainerBad, "trainer", "checking the Python files: %v", err)}
	}
	var ds diag.List
	for _, f := range found {
		line, _ := f[1].(float64)
		col, _ := f[2].(float64)
		ds = append(ds, diag.New(diag.TrainerBad, "trainer", "syntax error: %v", f[3]).At(fmt.Sprint(f[0]), int(line), int(col)).
			WithHelp("fix the file; the silo would fail the same way"))
	}
	return ds
}

func newTrainerInitCmd() *cobra.Command {
	var f trainerFlags
	cmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Run the trainer's init in the sandbox and write DIR/init.npy and DIR/layout.json, the run's initial model",
		Long: `Init runs "INTERPRETER ENTRY init" in the silo's sandbox (no data): the
helper builds the model and writes its flat weights and layout, which
init copies into DIR. A run starts from them; the aggregator runs no Python.
The trainer's content hash changes with them: check it afterwards.`,
		Example: "  scellis trainer init ./cnn && scellis trainer check ./cnn",
		Args:    exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := trainer.Load(args[0])
			if err != nil {
				return err
			}
			res, err := trainer.Run(cmd.Context(), f.job(b, trainer.ModeInit))
			if err != nil {
				return err
			}
			layout, _ := json.MarshalIndent(res.Layout, "", " ")
			if err := os.WriteFile(filepath.Join(args[0], trainer.InitFile), trainer.EncodeNPY(res.Weights), 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(args[0], trainer.LayoutFile), append(layout, '\n'), 0o644); err != nil {
				return err
			}
			b, err = trainer.Load(args[0])
			if err != nil {
				return err
			}
			ref, err := b.Ref()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d weights in %d tensors) and %s; trainer hash %s\n",
				filepath.Join(args[0], trainer.InitFile), len(res.Weights), len(res.Layout), trainer.LayoutFile, ref)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// trainerRun is what `trainer train` and `trainer eval` report.
type trainerRun struct {
	Mode     string             `json:"mode"`
	Examples int                `json:"examples"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Accuracy *float64           `json:"accuracy,omitempty"`
	Seconds  float64            `json:"seconds"`
	Out      string             `json:"out,omitempty"`
}

// startWeights reads the weights a run starts from: a model file of a
// trainer run (scellis fl model), an .npy, or the trainer's init.npy.
func startWeights(b *trainer.Bundle, modelPath, weightsPath string) ([]float64, trainer.Layout, error) {
	w, layout, err := b.Init()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case modelPath != "" && weightsPath != "":
		return nil, nil, usageError{fmt.Errorf("give --model or --weights, not both")}
	case modelPath != "":
		// Read as every model file is: a signed one is checked against
		// its signature (SC9406).
		mf, err := fl.ReadModelFile(modelPath)
		if err != nil {
			return nil, nil, err
		}
		if mf.Kind != fl.KindTrainer {
			return nil, nil, diag.New(diag.ModelFileBad, modelPath, "not the model file of a trainer run").
				WithHelp("export it with scellis fl model RUN_ID --out FILE")
		}
		ref, _ := b.Ref()
		if mf.Trainer != ref {
			return nil, nil, diag.New(diag.ModelFileBad, modelPath, "the model was trained by trainer %s; this directory is %s", mf.Trainer.Short(), ref.Short()).
				WithHelp("score a model with the trainer that trained it")
		}
		w = mf.Params
	case weightsPath != "":
		raw, err := safefile.ReadFile(weightsPath, trainer.MaxNPY)
		if err != nil {
			return nil, nil, diag.New(diag.FileUnreadable, weightsPath, "%v", err)
		}
		if w, _, err = trainer.DecodeNPY(raw); err != nil {
			return nil, nil, diag.New(diag.TrainerOutput, weightsPath, "%v", err)
		}
	}
	if len(w) != layout.Size() {
		return nil, nil, diag.New(diag.TrainerOutput, "weights", "%d weights; the trainer's layout has %d", len(w), layout.Size())
	}
	return w, layout, nil
}

// parseTrainerParams reads --param name=value flags: numbers as numbers,
// true/false as bools, the rest as strings.
func parseTrainerParams(kvs []string) (map[string]any, error) {
	p := map[string]any{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--param %q: write name=value, e.g. --param lr=0.05", kv)}
		}
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			p[k] = i
		} else if f, err := strconv.ParseFloat(v, 64); err == nil {
			p[k] = f
		} else if b, err := strconv.ParseBool(v); err == nil {
			p[k] = b
		} else {
			p[k] = v
		}
	}
	return p, nil
}

func newTrainerTrainCmd() *cobra.Command {
	var (
		f                         trainerFlags
		data, label, model, wfile string
		out                       string
		params                    []string
	)
	cmd := &cobra.Command{
		Use:   "train DIR --data FILE.csv [--param lr=0.05 …] [--out W.npy]",
		Short: "Train once on a file, in the sandbox, exactly as a silo's round would (no DP: nothing leaves)",
		Example: `  scellis trainer train ./cnn --data site-1.csv --param lr=0.05 --param epochs=2 --out w.npy
  scellis trainer eval ./cnn --data test.csv --weights w.npy`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTrainerCmd(cmd, &f, args[0], trainer.ModeTrain, data, label, model, wfile, out, params)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&data, "data", "", "the data file (a CSV with a header row; required)")
	cmd.Flags().StringVar(&label, "label", "label", "the label column")
	cmd.Flags().StringVar(&model, "model", "", "start from a trainer run's model file (scellis fl model); default init.npy")
	cmd.Flags().StringVar(&wfile, "weights", "", "start from these flat weights (.npy); default init.npy")
	cmd.Flags().StringVar(&out, "out", "", "write the trained weights here (.npy)")
	cmd.Flags().StringSliceVar(&params, "param", nil, "a round parameter name=value (lr, epochs, mu, batch_size, seed, …); repeat")
	return cmd
}

func newTrainerEvalCmd() *cobra.Command {
	var (
		f                         trainerFlags
		data, label, model, wfile string
		params                    []string
	)
	cmd := &cobra.Command{
		Use:   "eval DIR --data FILE.csv [--model MODEL.json | --weights W.npy]",
		Short: "Score weights with the trainer's evaluate, in the sandbox: examples, accuracy and the trainer's metrics",
		Example: `  scellis fl model RUN_ID --out model.json
  scellis trainer eval ./cnn --model model.json --data test.csv`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTrainerCmd(cmd, &f, args[0], trainer.ModeEvaluate, data, label, model, wfile, "", params)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&data, "data", "", "the labelled data file (required)")
	cmd.Flags().StringVar(&label, "label", "label", "the label column")
	cmd.Flags().StringVar(&model, "model", "", "a trainer run's model file (scellis fl model RUN_ID --out FILE)")
	cmd.Flags().StringVar(&wfile, "weights", "", "flat weights (.npy); default init.npy")
	cmd.Flags().StringSliceVar(&params, "param", nil, "a parameter name=value for the trainer; repeat")
	return cmd
}

func runTrainerCmd(cmd *cobra.Command, f *trainerFlags, dir, mode, data, label, model, wfile, out string, kvs []string) error {
	abs, err := trainerData(data)
	if err != nil {
		return err
	}
	params, err := parseTrainerParams(kvs)
	if err != nil {
		return err
	}
	res, err := f.run(cmd.Context(), dir, mode, abs, label, model, wfile, params)
	if err != nil {
		return err
	}
	rep := trainerRun{Mode: mode, Examples: res.Examples, Metrics: res.Metrics, Seconds: res.Took.Seconds(), Out: out}
	if c, ok := res.Metrics["correct"]; ok && res.Metrics["examples"] > 0 {
		acc := c / res.Metrics["examples"]
		rep.Accuracy = &acc
	}
	if out != "" {
		if err := os.WriteFile(out, trainer.EncodeNPY(res.Weights), 0o644); err != nil {
			return err
		}
	}
	o := cmd.OutOrStdout()
	if jsonOutput {
		enc := json.NewEncoder(o)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(o, "%s on %s: %d examples in %.1fs\n", mode, data, rep.Examples, rep.Seconds)
	if rep.Accuracy != nil {
		fmt.Fprintf(o, "accuracy  %.4f\n", *rep.Accuracy)
	}
	for _, k := range keysOf(res.Metrics) {
		fmt.Fprintf(o, "%-9s %g\n", k, res.Metrics[k])
	}
	if out != "" {
		fmt.Fprintf(o, "wrote %s\n", out)
	}
	return nil
}

// trainerData checks the --data file a trainer reads and returns its
// absolute path (the sandbox binds that file, and only it).
func trainerData(data string) (string, error) {
	if data == "" {
		return "", usageError{fmt.Errorf("give the data file with --data FILE.csv")}
	}
	abs, err := filepath.Abs(data)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(abs); err != nil || !st.Mode().IsRegular() {
		return "", diag.New(diag.FileUnreadable, data, "not a readable file").WithHelp("give the data file with --data FILE.csv")
	}
	return abs, nil
}

func keysOf(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// trainerExport is what `trainer export` reports.
type trainerExport struct {
	Out       string  `json:"out"`
	Bytes     int     `json:"bytes"`
	IRVersion int64   `json:"ir_version"`
	Producer  string  `json:"producer"`
	Nodes     int     `json:"nodes"`
	Checked   int     `json:"tensors_checked"`
	Tensors   int     `json:"tensors"`
	Seconds   float64 `json:"seconds"`
}

func newTrainerExportCmd() *cobra.Command {
	var (
		f                 trainerFlags
		model, wfile, out string
	)
	cmd := &cobra.Command{
		Use:   "export DIR (--model MODEL.json | --weights W.npy) --out MODEL.onnx",
		Short: "Write a trainer's model with the given weights as ONNX, in the sandbox, where the trainer provides an export",
		Long: `Export runs "INTERPRETER ENTRY export" in the silo's sandbox (no data): the
helper builds the model, loads the weights of the model file (refused if
another trainer trained it) or .npy, and writes it as ONNX with the
trainer's example_input (torch.onnx.export) or its own export function.
The file is checked to be an ONNX model whose tensors, named as the
model's, hold those weights; a trainer that provides no export is SC9512.`,
		Example: `  scellis fl model RUN_ID --out model.json
  scellis trainer export ./cnn --model model.json --out model.onnx`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{fmt.Errorf("give the ONNX file to write with --out MODEL.onnx")}
			}
			if model == "" && wfile == "" {
				return usageError{fmt.Errorf("give the weights to export: --model MODEL.json (scellis fl model) or --weights W.npy")}
			}
			res, err := f.run(cmd.Context(), args[0], trainer.ModeExport, "", "", model, wfile, nil)
			if err != nil {
				return err
			}
			m, err := trainer.ReadONNX(res.ONNX) // checked by the run
			if err != nil {
				return err
			}
			b, _ := trainer.Load(args[0])
			_, layout, _ := b.Init()
			if err := os.WriteFile(out, res.ONNX, 0o644); err != nil {
				return err
			}
			rep := trainerExport{Out: out, Bytes: len(res.ONNX), IRVersion: m.IRVersion, Producer: m.Producer, Nodes: m.Nodes,
				Checked: res.ONNXChecked, Tensors: len(layout), Seconds: res.Took.Seconds()}
			o := cmd.OutOrStdout()
			if jsonOutput {
				enc := json.NewEncoder(o)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			fmt.Fprintf(o, "wrote %s (%d bytes): ONNX IR %d from %s, %d nodes; %d of the model's %d tensors hold its weights\n",
				out, rep.Bytes, rep.IRVersion, rep.Producer, rep.Nodes, rep.Checked, rep.Tensors)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&model, "model", "", "a trainer run's model file (scellis fl model RUN_ID --out FILE)")
	cmd.Flags().StringVar(&wfile, "weights", "", "flat weights (.npy)")
	cmd.Flags().StringVar(&out, "out", "", "the ONNX file to write (required)")
	return cmd
}

func newTrainerHelperCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "helper",
		Short: "Print scellis_trainer.py, the helper module a silo puts on a trainer's import path (for local development)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(trainer.Helper)
			return err
		},
	}
}
