package fl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/memlimit"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/model"
)

// ModelFileFormat versions ModelFile; docs/models.md documents the schema.
// A reader refuses any other value (diag.ModelFormatUnknown). v3 added the
// attestation: v2 files, which no node signed, are refused with the help
// to export the model again.
const ModelFileFormat = "scellis/model/v3"

// ModelFile is a trained model as it leaves the federation: everything
// needed to use it outside (shape, feature names in order, label classes,
// the standardiser, the parameter layout) and everything needed to check
// where it came from (the run spec, per-round metrics, the privacy charges
// per silo, the content refs it was built from). JSON, for people and for
// any language; `scellis model eval` and `model predict` read it.
type ModelFile struct {
	Format string `json:"format"`
	// Model: kind (logistic, softmax, linear, mlp, cnn), inputs, hidden
	// width, a cnn's image shape [height, width, channels] and output
	// channels per convolution layer, and the label classes (0..K−1;
	// empty for regression).
	Kind     string    `json:"kind"`
	Inputs   int       `json:"inputs"`
	Hidden   int       `json:"hidden,omitempty"`
	Image    []int     `json:"image,omitempty"`
	Conv     []int     `json:"conv,omitempty"`
	Classes  []float64 `json:"classes"`
	Features []string  `json:"features"` // input order; empty: unnamed (every non-label column, in file order)
	Label    string    `json:"label,omitempty"`
	// Standardization maps raw features to the model's inputs:
	// x' = (x − mean) / std with the federation's statistics (mode
	// federated); mode local means every site used its own (no global
	// standardiser exists); none means raw features.
	Standardization Standardization   `json:"standardization"`
	Params          []float64         `json:"params"`
	Layout          model.ParamLayout `json:"layout"`
	// Global is the strategy's whole final state (Params is its "w").
	Global map[string]any `json:"global,omitempty"`
	// Trainer is the content hash of the trainer of a trainer run (kind
	// "trainer"): Params are its weights, flat in the order of its
	// layout.json; scellis trainer eval DIR --model FILE scores them.
	Trainer content.Ref `json:"trainer,omitempty"`

	Run     ModelRun       `json:"run"`
	Rounds  []RoundSummary `json:"rounds"`
	Privacy []SiloCharges  `json:"privacy"`
	Refs    ModelRefs      `json:"refs"`

	// Attestation is the signature of the aggregator node that assembled
	// the file from its replica of the run (`fl model`); nil for a file
	// no node signed (`fl simulate`, by hand).
	Attestation *Attestation `json:"attestation,omitempty"`
}

// Attestation says which aggregator node assembled a model file and signs
// everything else in it. The signature is over the compact JSON encoding
// of the file as parsed, with this field's signature left out (SignedContent):
// a reader reproduces it exactly from the file, whatever its whitespace.
type Attestation struct {
	Member    string             `json:"member"`
	Key       identity.PublicKey `json:"key"`
	Signature []byte             `json:"signature,omitempty"`
}

// ModelRun is the run a model came from.
type ModelRun struct {
	ID    content.Ref `json:"id"`
	Name  string      `json:"name"`
	State string      `json:"state"`
	Spec  *Canonical  `json:"spec"`
}

// RoundSummary is one step of the run as the model file records it: the
// summed metrics divided out (training metrics are the incoming model on
// the silos' training rows, before local training; held-out ones on rows
// no silo trained on).
type RoundSummary struct {
	Round        int                `json:"round"`
	Step         string             `json:"step"`
	Participants []string           `json:"participants"`
	Dropped      []string           `json:"dropped"`
	Absent       []string           `json:"absent,omitempty"` // left out of the cohort: not alive when the round was planned
	TrainLoss    float64            `json:"train_loss,omitempty"`
	TrainAcc     float64            `json:"train_accuracy,omitempty"`
	EvalLoss     float64            `json:"eval_loss,omitempty"`
	EvalAcc      float64            `json:"eval_accuracy,omitempty"`
	EvalRows     float64            `json:"eval_rows,omitempty"`
	Sums         map[string]float64 `json:"sums"`
	Model        content.Ref        `json:"model"`
	Epsilon      map[string]float64 `json:"epsilon,omitempty"` // ε charged this round, per silo
	Declined     map[string]string  `json:"declined,omitempty"`
	// Staleness: a buffered run's stale participants (RoundResult).
	Staleness map[string]int `json:"staleness,omitempty"`
}

// SiloCharges sums one silo's charges for the run (per-round ε as each
// ledger entry states it; the ledger composes them in RDP, so their sum is
// an upper bound of what the run cost that silo).
type SiloCharges struct {
	Silo       string  `json:"silo"`
	Rounds     int     `json:"rounds"`
	EpsilonSum float64 `json:"epsilon_sum"`
}

// ModelRefs are the content refs the model was built from.
type ModelRefs struct {
	Run          content.Ref   `json:"run"`
	Strategy     content.Ref   `json:"strategy"`
	Model        content.Ref   `json:"model"`
	RoundResults []content.Ref `json:"round_results"`
	RoundJobs    []content.Ref `json:"round_jobs"`
	Receipts     []content.Ref `json:"receipts"`
}

// NewModelFile builds the model part of a model file from a run's canonical
// spec, its final global state and standardisation.
func NewModelFile(spec *Canonical, global Global, std *Standardization) (*ModelFile, error) {
	if spec.Trainer != "" {
		return trainerModelFile(spec, global)
	}
	ms := spec.ModelSpec()
	layout, err := ms.Layout()
	if err != nil {
		return nil, err
	}
	w, ok := global.Vector("w")
	if !ok {
		return nil, errors.New("fl: the final global state has no parameter vector w")
	}
	if len(w) != layout.Params {
		return nil, fmt.Errorf("fl: the global state's w has %d values; a %s model of %d inputs has %d", len(w), ms.Kind, ms.Inputs, layout.Params)
	}
	f := &ModelFile{Format: ModelFileFormat, Kind: ms.Kind, Inputs: ms.Inputs, Hidden: ms.Hidden, Conv: slices.Clone(ms.Conv),
		Features: slices.Clone(spec.Spec.Model.Features), Label: spec.Spec.Model.Label,
		Params: w, Layout: layout, Global: global, Classes: []float64{}}
	for k := range ms.ClassCount() {
		f.Classes = append(f.Classes, float64(k))
	}
	if ms.Kind == model.KindCNN {
		f.Image = ms.Image[:]
	}
	if std != nil {
		f.Standardization = *std
	} else {
		f.Standardization = Standardization{Mode: spec.Spec.StandardizeMode()}
	}
	return f, nil
}

// Spec returns the model.Spec the file describes.
func (f *ModelFile) Spec() model.Spec {
	s := model.Spec{Kind: f.Kind, Inputs: f.Inputs, Hidden: f.Hidden, Conv: f.Conv}
	if len(f.Image) == 3 {
		s.Image = [3]int(f.Image)
	} else if len(f.Image) != 0 {
		s.Image = [3]int{-1, -1, -1} // not a shape: Validate refuses it
	}
	deep := f.Kind == model.KindMLP || f.Kind == model.KindCNN
	switch {
	case deep && len(f.Classes) == 0:
		s.Classes = 1
	case f.Kind == model.KindSoftmax || deep:
		s.Classes = len(f.Classes)
	}
	return s
}

// Model returns the usable model: spec, parameters and (federated mode) the
// global standardiser.
func (f *ModelFile) Model() *model.Model {
	return &model.Model{Spec: f.Spec(), Params: slices.Clone(f.Params), Std: f.Standardization.Standardizer()}
}

// Sign returns the encoded file (indented JSON, as `fl model` writes it)
// signed by id as federation member. What is signed is the file as a
// reader parses it: the content goes through one encode and decode first,
// so that the bytes signed are the ones a reader re-encodes from the file.
func (f *ModelFile) Sign(id *identity.Identity, member string) ([]byte, error) {
	plain := *f
	plain.Attestation = nil
	b, err := json.Marshal(&plain)
	if err != nil {
		return nil, err
	}
	var g ModelFile
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, err
	}
	g.Attestation = &Attestation{Member: member, Key: id.Public()}
	msg, err := g.SignedContent()
	if err != nil {
		return nil, err
	}
	g.Attestation.Signature = identity.Sign(id, identity.PurposeModelFile, msg)
	out, err := json.MarshalIndent(&g, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// SignedContent is what the attestation signs: the compact JSON encoding
// of the file with the attestation's signature left out (its member and
// key are signed too, so neither can be swapped).
func (f *ModelFile) SignedContent() ([]byte, error) {
	c := *f
	if f.Attestation != nil {
		a := *f.Attestation
		a.Signature = nil
		c.Attestation = &a
	}
	return json.Marshal(&c)
}

// ReadModelFile reads and checks a model file (ParseModelFile).
func ReadModelFile(path string) (*ModelFile, error) {
	b, err := safefile.ReadFile(path, safefile.MaxDataset)
	if err != nil {
		return nil, diag.New(diag.ModelFileBad, path, "cannot read the model file: %v", err).WithHelp("export one with scellis fl model RUN_ID --out FILE")
	}
	return ParseModelFile(b, path)
}

// ParseModelFile checks a model file's bytes (path names it in
// diagnostics). Every problem is a diagnostic: not a model file or parts
// that disagree (SC9401), a format version this build does not know
// (SC9402), a signed file whose content is not what its signer signed
// (SC9406). An unsigned file is read (fl simulate writes them); the
// signer's membership is the caller's to check against a federation.
func ParseModelFile(b []byte, path string) (*ModelFile, error) {
	// Decoded, a file's numbers take up to four times their text, and a
	// signed file is decoded twice more as plain JSON (interfaces, about
	// three times that again) to compare it with what was signed.
	if !memlimit.Fits(int64(len(b)) * 16) {
		return nil, memlimit.TooLarge(path, fmt.Sprintf("a model file of %d MiB", len(b)>>20), "score it on a machine with more memory")
	}
	var probe struct {
		Format string `json:"format"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, diag.New(diag.ModelFileBad, path, "not a model file (JSON): %v", err).WithHelp("export one with scellis fl model RUN_ID --out FILE")
	}
	if probe.Format != ModelFileFormat {
		help := fmt.Sprintf("this scellis reads %s; ", ModelFileFormat)
		if strings.HasPrefix(probe.Format, "scellis/model/") {
			help += "export the model again with this version's scellis fl model"
		} else {
			help += "is this a model file written by scellis fl model?"
		}
		return nil, diag.New(diag.ModelFormatUnknown, path, "model file format %q is not one this version reads", probe.Format).WithHelp("%s", help)
	}
	var f ModelFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, diag.New(diag.ModelFileBad, path, "the model file does not fit %s: %v", ModelFileFormat, err).WithHelp("export the model again")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, diag.New(diag.ModelFileBad, path, "the model file has more after its JSON object").WithHelp("export the model again")
	}
	bad := func(format string, args ...any) error {
		return diag.New(diag.ModelFileBad, path, format, args...).WithHelp("the file was changed after export; export the model again")
	}
	if f.Attestation != nil {
		if err := f.checkAttestation(b, path); err != nil {
			return nil, err
		}
	}
	if f.Kind == KindTrainer {
		// A trainer run's weights, in its trainer's own layout: only the
		// trainer scores them (scellis trainer eval; ErrTrainerModel).
		if f.Trainer == "" || len(f.Params) == 0 {
			return nil, bad("a trainer model without its trainer's hash or weights")
		}
		return &f, nil
	}
	spec := f.Spec()
	if err := spec.Validate(); err != nil {
		return nil, bad("the model's shape is invalid: %v", err)
	}
	if n := spec.NumParams(); len(f.Params) != n {
		return nil, bad("%d parameters; a %s model of %d inputs has %d", len(f.Params), f.Kind, f.Inputs, n)
	}
	if len(f.Features) != 0 && len(f.Features) != f.Inputs {
		return nil, bad("%d feature names for %d inputs", len(f.Features), f.Inputs)
	}
	switch f.Standardization.Mode {
	case StandardizeFederated:
		if len(f.Standardization.Mean) != f.Inputs || len(f.Standardization.Std) != f.Inputs {
			return nil, bad("the standardiser covers %d features, the model has %d inputs", len(f.Standardization.Mean), f.Inputs)
		}
	case StandardizeLocal, StandardizeNone:
	default:
		return nil, bad("unknown standardisation mode %q", f.Standardization.Mode)
	}
	return &f, nil
}

// checkAttestation checks a signed file: the signature verifies over the
// content as parsed, and the file holds nothing the parse dropped or
// merged — a key spelt in another case (Go's decoder matches it, another
// language's would read a second field), a value of another type — so
// that what any reader sees is what was signed.
func (f *ModelFile) checkAttestation(raw []byte, path string) error {
	a := f.Attestation
	mismatch := func(format string, args ...any) error {
		return diag.New(diag.ModelSignatureBad, path, format, args...).
			WithHelp("the file was changed after %s signed it; export the model again with scellis fl model RUN_ID --out FILE", a.Member)
	}
	msg, err := f.SignedContent()
	if err != nil {
		return mismatch("the model file's content cannot be encoded: %v", err)
	}
	if !identity.Verify(a.Key, identity.PurposeModelFile, msg, a.Signature) {
		return mismatch("the model file's content is not what %s (key %s) signed", a.Member, a.Key)
	}
	full, err := json.Marshal(f)
	var asFile, asParsed any
	if err != nil || json.Unmarshal(raw, &asFile) != nil || json.Unmarshal(full, &asParsed) != nil {
		return mismatch("the model file cannot be read as plain JSON")
	}
	if !reflect.DeepEqual(asFile, asParsed) {
		return mismatch("the model file holds fields its signed content does not (a key spelt otherwise, or a value a reader drops)")
	}
	return nil
}

// Prepare fits a dataset read from a CSV to the model: the model's features
// picked by name in its order (the file's other columns ignored; a missing
// one refused with the list, SC9403), and labels checked against the
// model's classes (SC9404) when labelled is set. Without feature names the
// file's non-label columns are taken in order.
func (f *ModelFile) Prepare(d *model.Dataset, file string, labelled bool) (*model.Dataset, error) {
	out := d
	if len(f.Features) > 0 {
		idx := make([]int, len(f.Features))
		var missing []string
		for i, name := range f.Features {
			idx[i] = slices.Index(d.Features, name)
			if idx[i] < 0 {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return nil, diag.New(diag.ModelColumnsMissing, file, "the data has no column %s (the model's features are %s)",
				strings.Join(missing, ", "), strings.Join(f.Features, ", ")).At(file, 1, 1).
				WithHelp("the columns are matched by name; add or rename the missing ones (the file has: %s)", strings.Join(d.Features, ", "))
		}
		out = pick(d, f.Features, idx)
	} else if d.Dims() != f.Inputs {
		return nil, diag.New(diag.ModelColumnsMissing, file, "the data has %d feature columns; the model (no feature names) takes %d", d.Dims(), f.Inputs).
			At(file, 1, 1).WithHelp("give exactly the model's inputs, in its order, besides the label column")
	}
	if labelled && len(f.Classes) > 0 {
		for i, y := range out.Y {
			if !slices.Contains(f.Classes, y) {
				return nil, diag.New(diag.ModelLabelUnknown, file, "row %d has label %v; the model's classes are %s", i+1, y, classList(f.Classes)).
					At(file, i+2, 1).WithHelp("score rows whose labels are among the model's classes, or check --label names the right column")
			}
		}
	}
	if f.Standardization.Mode == StandardizeLocal && out.Rows() > 0 {
		// No global standardiser exists: every silo used its own. Score as
		// a silo would, with the data's own statistics.
		s := model.FitStandardizer(out)
		out = s.Apply(out)
	}
	return out, nil
}

func classList(c []float64) string {
	s := make([]string, len(c))
	for i, v := range c {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

// NewRoundSummary summarises one step from its summed metrics: training
// loss and accuracy per example of the training sums, held-out ones per
// example of the eval_ sums. The watch table and the model file use it.
func NewRoundSummary(round int, step string, participants, dropped []string, sums map[string]float64, model content.Ref) RoundSummary {
	if step == "" {
		step = StepTrain
	}
	row := RoundSummary{Round: round, Step: step, Participants: participants, Dropped: dropped, Sums: sums,
		Epsilon: map[string]float64{}, Declined: map[string]string{}, Model: model}
	// Under DP the sums are noised, and a ratio of two noised sums can be
	// impossible (an accuracy of 1.32, a negative loss): each is clamped
	// to the possible range, post-processing that costs no privacy. The
	// sums themselves stay as released.
	if n := sums["examples"]; n > 0 {
		row.TrainLoss = max(0, sums["loss"]/n)
		row.TrainAcc = min(1, max(0, sums["correct"]/n))
	}
	if n := sums["eval_examples"]; n > 0 {
		row.EvalLoss = max(0, sums["eval_loss"]/n)
		row.EvalAcc = min(1, max(0, sums["eval_correct"]/n))
		row.EvalRows = n
	}
	return row
}

// ScoredByTrainer refuses, for model predict without the trainer, the
// model of a trainer run: its weights are in the trainer's own layout, and
// only the trainer runs them (SC9401 with the command that does).
func (f *ModelFile) ScoredByTrainer(path string) error {
	if f.Kind != KindTrainer {
		return nil
	}
	return diag.New(diag.ModelFileBad, path, "the model of a trainer run (trainer %s) predicts through its trainer", f.Trainer.Short()).
		WithHelp("give the trainer's directory: scellis model predict %s --trainer DIR --data FILE.csv --out FILE.csv", path)
}
