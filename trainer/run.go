package trainer

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Helper is the pure-Python helper module (scellis_trainer.py) the silo
// puts on the trainer's import path: it turns the file protocol into
// train(model, loader, params) and evaluate(model, loader) calls.
//
//go:embed python/scellis_trainer.py
var Helper []byte

// HelperModule is the file name the helper is imported as.
const HelperModule = "scellis_trainer.py"

// The modes a trainer runs in.
const (
	ModeInit     = "init"
	ModeTrain    = "train"
	ModeEvaluate = "evaluate"
	// ModePredict gives the model's outputs for every row of the data
	// file, in its order (scellis model predict --trainer).
	ModePredict = "predict"
	// ModeExport writes the model, loaded with the job's weights, as an
	// ONNX file, when the trainer provides an export (example_input or
	// export, given to scellis_trainer.main).
	ModeExport = "export"
)

// Limits bound one trainer run; they come from the silo's policy.
type Limits struct {
	// CPUSeconds is RLIMIT_CPU: CPU time over all the trainer's threads.
	CPUSeconds int
	// MemoryMB is RLIMIT_AS: the trainer's address space.
	MemoryMB int
	// Wall is the wall-clock limit; past it the sandbox is killed.
	Wall time.Duration
	// ScratchMB bounds the scratch directory (a tmpfs).
	ScratchMB int
	// Threads is the trainer's thread count (OMP_NUM_THREADS), 1 when 0.
	Threads int
}

// DefaultLimits are a trainer's limits when the policy gives none.
var DefaultLimits = Limits{CPUSeconds: 600, MemoryMB: 4096, Wall: 10 * time.Minute, ScratchMB: 256, Threads: 1}

// WithDefaults fills the zero limits from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	if l.CPUSeconds > 0 {
		d.CPUSeconds = l.CPUSeconds
	}
	if l.MemoryMB > 0 {
		d.MemoryMB = l.MemoryMB
	}
	if l.Wall > 0 {
		d.Wall = l.Wall
	}
	if l.ScratchMB > 0 {
		d.ScratchMB = l.ScratchMB
	}
	if l.Threads > 0 {
		d.Threads = l.Threads
	}
	return d
}

// Job is one run of a trainer.
type Job struct {
	// Interpreter runs the entry point (the policy's, e.g. /usr/bin/python3).
	Interpreter string
	Bundle      *Bundle
	Mode        string
	// Data is the dataset file on the host, bound read-only into the
	// sandbox ("" for init). Label is its label column.
	Data, Label string
	// Weights (flat) and Layout are the model the trainer starts from
	// (nil for init).
	Weights []float64
	Layout  Layout
	// Params are the round's parameters (lr, epochs, mu, seed, …).
	Params map[string]any
	// Dir is where the job's files are made (a fresh folder inside it,
	// removed afterwards): a folder of the silo's own.
	Dir    string
	Limits Limits
}

// Result is what a trainer returned.
type Result struct {
	// Weights are the trained (train) or initial (init) weights, flat.
	Weights []float64
	// Layout is init's layout.
	Layout   Layout
	Examples int
	Metrics  map[string]float64
	// ONNX is export's file, checked to be an ONNX model carrying the
	// job's weights (ONNXModel.CheckWeights); ONNXChecked is how many of
	// the layout's tensors that covered.
	ONNX        []byte
	ONNXChecked int
	// Predictions are predict's outputs, one row per example, all of
	// one width, finite.
	Predictions [][]float64
	// Log is the tail of the trainer's output, for the silo's own log.
	Log string
	// Took is the trainer process's wall-clock time.
	Took time.Duration
}

// spec is params.json.
type spec struct {
	Format string         `json:"format"`
	Mode   string         `json:"mode"`
	Data   *string        `json:"data"`
	Label  string         `json:"label"`
	Layout Layout         `json:"layout"`
	Params map[string]any `json:"params"`
}

// Paths inside the sandbox.
const (
	sandboxTrainer = "/trainer"
	sandboxHelper  = "/scellis"
	sandboxData    = "/data"
	sandboxIO      = "/io"
	sandboxScratch = "/scratch"
)

// writeInputs lays out the job folder: trainer/ (the bundle), lib/ (the
// helper), io/in (params.json, weights.npy), io/out (for the answer).
func writeInputs(dir string, j Job) error {
	for _, d := range []string{"trainer", "lib", "io/in", "io/out", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := j.Bundle.Unpack(filepath.Join(dir, "trainer")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", HelperModule), Helper, 0o444); err != nil {
		return err
	}
	s := spec{Format: Format, Mode: j.Mode, Label: j.Label, Layout: j.Layout, Params: j.Params}
	if j.Data != "" {
		p := sandboxData + "/" + filepath.Base(j.Data)
		s.Data = &p
	}
	if s.Params == nil {
		s.Params = map[string]any{}
	}
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "io", "in", "params.json"), b, 0o444); err != nil {
		return err
	}
	if j.Weights != nil {
		if err := os.WriteFile(filepath.Join(dir, "io", "in", "weights.npy"), EncodeNPY(j.Weights), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// readOutputs reads and checks the trainer's answer: result.json, and for
// train and init weights.npy of the layout's size, all finite.
func readOutputs(dir string, j Job, subject string) (Result, error) {
	var r Result
	out := filepath.Join(dir, "io", "out")
	garbage := func(format string, args ...any) error {
		return diag.New(diag.TrainerOutput, subject, format, args...).
			WithHelp("the trainer writes io/out/weights.npy (the flat weights, float32 or float64) and io/out/result.json ({\"examples\": N, \"metrics\": {…}}); scellis_trainer.main does it")
	}
	raw, err := safefile.ReadFile(filepath.Join(out, "result.json"), 1<<20)
	if err != nil {
		return r, garbage("no readable result.json: %v", err)
	}
	var res struct {
		Examples json.Number            `json:"examples"`
		Metrics  map[string]json.Number `json:"metrics"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&res); err != nil {
		return r, garbage("result.json is not {\"examples\": N, \"metrics\": {…}}: %v", err)
	}
	if n, err := res.Examples.Int64(); err != nil || n < 0 || n > 1<<40 {
		return r, garbage("result.json gives examples %q; it must be a count", res.Examples)
	} else {
		r.Examples = int(n)
	}
	r.Metrics = map[string]float64{}
	for k, v := range res.Metrics {
		f, err := v.Float64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return r, diag.New(diag.TrainerNonFinite, subject, "metric %q is %q", k, v).WithHelp("metrics are finite numbers")
		}
		r.Metrics[k] = f
	}
	if j.Mode == ModeEvaluate {
		return r, nil
	}
	if j.Mode == ModeExport {
		return readExport(out, j, subject, r)
	}
	if j.Mode == ModePredict {
		return readPredictions(out, subject, r)
	}
	wraw, err := safefile.ReadFile(filepath.Join(out, "weights.npy"), MaxNPY)
	if err != nil {
		return r, garbage("no readable weights.npy: %v", err)
	}
	w, _, err := DecodeNPY(wraw)
	if err != nil {
		return r, garbage("weights.npy: %v", err)
	}
	want := j.Layout
	if j.Mode == ModeInit {
		lraw, err := safefile.ReadFile(filepath.Join(out, "layout.json"), 1<<20)
		if err != nil {
			return r, garbage("init wrote no readable layout.json: %v", err)
		}
		if want, err = ParseLayout(lraw); err != nil {
			return r, garbage("layout.json: %v", err)
		}
		r.Layout = want
	}
	if len(w) != want.Size() {
		return r, garbage("weights.npy holds %d values; the model's layout has %d", len(w), want.Size())
	}
	if i := nonFinite(w); i >= 0 {
		return r, diag.New(diag.TrainerNonFinite, subject, "weights.npy holds %v at index %d (of %d)", w[i], i, len(w)).
			WithHelp("the trainer diverged: lower the learning rate, or check the model on this data with scellis trainer train")
	}
	r.Weights = w
	return r, nil
}

// readPredictions reads predict's predictions.npy: a rows × k array, a
// row for each of the examples result.json counts, all finite.
func readPredictions(out, subject string, r Result) (Result, error) {
	bad := func(format string, args ...any) (Result, error) {
		return r, diag.New(diag.TrainerOutput, subject, format, args...).
			WithHelp("the trainer's predict returns one row per example, in the data file's order; scellis_trainer.main writes io/out/predictions.npy")
	}
	raw, err := safefile.ReadFile(filepath.Join(out, "predictions.npy"), MaxNPY)
	if err != nil {
		return bad("no readable predictions.npy: %v", err)
	}
	v, shape, err := DecodeNPY(raw)
	if err != nil {
		return bad("predictions.npy: %v", err)
	}
	if len(shape) != 2 || shape[0] != r.Examples || (r.Examples > 0 && shape[1] < 1) {
		return bad("predictions.npy has shape %v; want %d rows (the examples) of one or more outputs", shape, r.Examples)
	}
	if i := nonFinite(v); i >= 0 {
		return r, diag.New(diag.TrainerNonFinite, subject, "predictions.npy holds %v at index %d", v[i], i).
			WithHelp("the model's outputs must be finite")
	}
	r.Predictions = make([][]float64, shape[0])
	for i := range r.Predictions {
		r.Predictions[i] = v[i*shape[1] : (i+1)*shape[1]]
	}
	return r, nil
}

// readExport reads export's model.onnx: an ONNX model whose tensors
// named as the layout's hold the job's weights. A trainer that wrote none
// provides no export (SC9512).
func readExport(out string, j Job, subject string, r Result) (Result, error) {
	raw, err := safefile.ReadFile(filepath.Join(out, ONNXFile), int64(16*len(j.Weights))+64<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return r, diag.New(diag.TrainerNoExport, subject, "the trainer wrote no %s: it provides no ONNX export", ONNXFile).
			WithHelp("pass example_input (a function of params returning one input tensor) or export (model, path, params) to scellis_trainer.main; docs/trainers.md")
	}
	bad := func(format string, args ...any) (Result, error) {
		return r, diag.New(diag.TrainerOutput, subject, format, args...).
			WithHelp("the trainer's export writes io/out/%s, the model with the weights it was given (torch.onnx.export does)", ONNXFile)
	}
	if err != nil {
		return bad("no readable %s: %v", ONNXFile, err)
	}
	m, err := ReadONNX(raw)
	if err != nil {
		return bad("%s: %v", ONNXFile, err)
	}
	if r.ONNXChecked, err = m.CheckWeights(j.Weights, j.Layout); err != nil {
		return bad("%s does not carry the model's weights: %v", ONNXFile, err)
	}
	r.ONNX = raw
	return r, nil
}

// memoryDeath recognises a trainer that ran out of address space:
// Python's MemoryError, PyTorch's and C++'s allocation failures.
func memoryDeath(log string) bool {
	for _, s := range []string{"MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc", "out of memory", "Unable to allocate", "failed to map segment from shared object"} {
		if strings.Contains(log, s) {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

func (j Job) subject() string { return fmt.Sprintf("trainer %s (%s)", j.Bundle.Entry, j.Mode) }
