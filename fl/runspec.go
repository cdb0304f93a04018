package fl

import (
	"errors"
	"fmt"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/trainer"
	"github.com/scellis/scellis/trust"
)

// RunSpec is a training run as a data scientist writes it (RUN.yaml).
//
//	name: fedprox-hospitals
//	strategy: {use: fedprox, params: {mu: 0.1, lr: 0.1, epochs: 1}}
//	model: {kind: logistic, inputs: 9}
//	dataset: patients            # the dataset name every silo declares
//	rounds: 20
//	cohort: {silos: [hospital-1, hospital-2, hospital-3, hospital-4], min: 3}
//	privacy: {clip: 1.0, sigma: 1.1, q: 0.05, steps: 20}
//	secure_aggregation: true
//	aggregation: masking         # or threshold-he
//	masking: secagg+             # or pairwise; default by cohort size
//	seed: 7
type RunSpec struct {
	Name     string `cbor:"name" json:"name"`
	Strategy string `cbor:"strategy" json:"strategy"` // catalog name, path or ref as written
	// StrategyClass is the strategy content's class (strategy.class).
	StrategyClass trust.Class    `cbor:"strategy_class,omitempty" json:"strategy_class,omitempty"`
	Params        map[string]any `cbor:"params" json:"params"`
	Model         ModelSpec      `cbor:"model" json:"model"`
	Dataset       string         `cbor:"dataset" json:"dataset"`
	Rounds        int            `cbor:"rounds" json:"rounds"`
	Silos         []string       `cbor:"silos" json:"silos"` // empty: every silo of the federation
	MinCohort     int            `cbor:"min_cohort" json:"min_cohort"`
	// Sample is the fraction of the alive cohort a training round samples
	// (0: every silo); never fewer than max(3, MinCohort). Stragglers is
	// the fraction of a training round's silos that may do only part of
	// their local work (params work uniform in (0, 1)), the systems
	// heterogeneity of Li et al. 2020. Sampling and straggling are public
	// (the round's members are): no privacy amplification is claimed.
	Sample     float64 `cbor:"sample,omitempty" json:"sample,omitempty"`
	Stragglers float64 `cbor:"stragglers,omitempty" json:"stragglers,omitempty"`
	// Buffer, when set, makes the run buffered-asynchronous (FedBuff,
	// Nguyen et al. 2022): every server step sums the updates of Buffer
	// silos (at least 3, for secure aggregation), and each of them trains
	// from the global version it last fetched — the one published after
	// its previous contribution — and is told its staleness (params
	// staleness: the server steps since that version). The leader draws
	// which silos fill each buffer as it draws a sample (RoundCohort).
	Buffer int `cbor:"buffer,omitempty" json:"buffer,omitempty"`
	// Privacy parameters; each silo applies them at its dataset's unit
	// (record-level DP-SGD or update-level). DP false only in own pools.
	DP    bool    `cbor:"dp" json:"dp"`
	Clip  float64 `cbor:"clip" json:"clip"`
	Sigma float64 `cbor:"sigma" json:"sigma"`
	Q     float64 `cbor:"q" json:"q"` // DP-SGD's per-record sampling rate
	// Participation is privacy.participation, the probability a silo
	// takes part in a round; 0 (unset) is 1, the only value silos accept.
	Participation float64 `cbor:"participation,omitempty" json:"participation,omitempty"`
	Steps         int     `cbor:"steps" json:"steps"`
	SecureAgg     bool    `cbor:"secure_agg" json:"secure_agg"`
	// Aggregation is how the secure sum is formed: AggMasking (stored
	// empty, so a spec that names the default hashes as one that does
	// not) or AggThresholdHE (package secagg/he).
	Aggregation string `cbor:"aggregation,omitempty" json:"aggregation,omitempty"`
	// Masking is the masking protocol of an aggregation: masking run:
	// secagg.Pairwise or secagg.SecAggPlus; empty lets each round pick
	// by its cohort size (secagg.DefaultProtocol).
	Masking string `cbor:"masking,omitempty" json:"masking,omitempty"`
	Seed    int64  `cbor:"seed" json:"seed"`
	// FeatureBounds are public ranges of the features (a data
	// dictionary's), one per model input, as half-widths H_j around
	// FeatureCenters C_j (nil: every C_j is 0): privacy.feature_bounds
	// gives each as B (the range [−B, B]) or [lo, hi]. Under DP the
	// statistics step clips each value to its range and releases sums of
	// u = (x − C)/H, which bounds a row's contribution whatever the data
	// (StatsRecords). Required when DP is on and the statistics are
	// federated. A range close around the data is worth more than budget:
	// the noise on a mean is proportional to H, on a variance to H².
	FeatureBounds  []float64 `cbor:"feature_bounds,omitempty" json:"feature_bounds,omitempty"`
	FeatureCenters []float64 `cbor:"feature_centers,omitempty" json:"feature_centers,omitempty"`
	// SumsSigma is the noise multiplier of the statistics and evaluation
	// steps' releases (privacy.sums_sigma; 0: Sigma). One q = 1 Gaussian
	// release at DP-SGD's σ ≈ 1 costs ε ≈ 4.7 at δ = 1e-5, so a run
	// usually gives these steps more noise than its training.
	SumsSigma float64 `cbor:"sums_sigma,omitempty" json:"sums_sigma,omitempty"`
	// EvalSigma is the noise multiplier of the evaluation steps' releases
	// alone (privacy.eval_sigma; 0: SumsSigma, else Sigma): they only
	// report on the model, so a run may give them more noise than the
	// statistics, which shape it (scellis privacy plan prices both).
	EvalSigma float64 `cbor:"eval_sigma,omitempty" json:"eval_sigma,omitempty"`
	// PublicRows (privacy.public_rows) sums the statistics step's row
	// count unnoised, outside the Gaussian release: the federation's total
	// training rows become public, the noised vector loses a coordinate
	// and the means and variances are divided by the exact count. Each
	// silo's dataset must declare public_rows: true (its data owner
	// agrees that its row count is not secret), else the silo declines
	// the statistics step (SC9215).
	PublicRows bool `cbor:"public_rows,omitempty" json:"public_rows,omitempty"`
	// Standardize says whose statistics standardise the features: the
	// federation's (secure sums, StandardizeFederated, the default when
	// empty), each silo's own (StandardizeLocal) or none.
	Standardize string `cbor:"standardize,omitempty" json:"standardize,omitempty"`
	// Eval declares federated evaluation: a held-out fraction of each
	// silo's rows, or a named evaluation dataset every silo declares.
	Eval EvalSpec `cbor:"evaluation,omitempty" json:"evaluation,omitzero"`
	// WarmStart, if set, is the round result (a model) another run ended
	// a round with: the run's first round starts from its parameters
	// instead of init's (scellis fl launch --warm-start RUN). It is part of
	// the spec, hence of the run's ID.
	WarmStart content.Ref `cbor:"warm_start,omitempty" json:"warm_start,omitempty"`
	// Trainer names the run's trainer (docs/trainers.md): a directory of
	// Python files every silo runs in its sandbox instead of the
	// strategy's client step, as written in the run file; the canonical
	// spec keeps the directory's base name and Canonical.Trainer its
	// content hash. A trainer run has no statistics step (standardize is
	// none) and its model is the trainer's (init.npy).
	Trainer string `cbor:"trainer,omitempty" json:"trainer,omitempty"`

	File string `cbor:"-" json:"-"`
}

// ModelSpec names the model the run trains.
// Inputs and Classes fix the model's shape before any silo is asked, so
// the aggregator can build the initial model and size the secure sum.
type ModelSpec struct {
	Kind    string `cbor:"kind" json:"kind"`
	Inputs  int    `cbor:"inputs" json:"inputs"`
	Classes int    `cbor:"classes,omitempty" json:"classes,omitempty"`
	Hidden  int    `cbor:"hidden,omitempty" json:"hidden,omitempty"`
	// Image is a cnn's input shape [height, width, channels]
	// (model.image; channels 1 when given as [height, width]): a row's
	// inputs are its pixels row-major, channels last (model.Spec.Image).
	Image []int `cbor:"image,omitempty" json:"image,omitempty"`
	// Conv is a cnn's output channels per convolution layer (model.conv).
	Conv []int `cbor:"conv,omitempty" json:"conv,omitempty"`
	// Features names the model's inputs in order; silos pick their
	// columns by these names (and refuse a dataset that lacks one). Empty:
	// every non-label column, in the silo's file order.
	Features []string `cbor:"features,omitempty" json:"features,omitempty"`
	// Label names the label column, for the model file (silos take theirs
	// from their dataset declarations).
	Label string `cbor:"label,omitempty" json:"label,omitempty"`
	// Class is the model's class: a confidential model refuses an open
	// pool (SC4003), since every silo holds the model it trains.
	Class trust.Class `cbor:"class,omitempty" json:"class,omitempty"`
}

// EvalSpec is a run's federated evaluation: each silo evaluates the
// current global model on rows it never trains on, every round and after
// the last, and only the sums leave (secure aggregation).
type EvalSpec struct {
	// Holdout is the fraction of each silo's rows held out (0: none).
	Holdout float64 `cbor:"holdout,omitempty" json:"holdout,omitempty"`
	// Dataset names an evaluation dataset every silo declares instead.
	Dataset string `cbor:"dataset,omitempty" json:"dataset,omitempty"`
	// Every, when set, adds an evaluation step after every Every training
	// rounds (besides the final one): under DP each is one more charged,
	// noised release (at privacy.eval_sigma), the only held-out figures a
	// DP run reports while it trains.
	Every int `cbor:"every,omitempty" json:"every,omitempty"`
}

// On reports whether the run evaluates on held-out rows.
func (e EvalSpec) On() bool { return e.Holdout > 0 || e.Dataset != "" }

// Standardisation modes (RunSpec.Standardize).
const (
	StandardizeFederated = "federated"
	StandardizeLocal     = "local"
	StandardizeNone      = "none"
)

// Aggregation modes (RunSpec.Aggregation): pairwise masking (package
// secagg) or threshold homomorphic encryption (package secagg/he).
const (
	AggMasking     = "masking"
	AggThresholdHE = "threshold-he"
)

// AggregationMode returns the run's aggregation mode, masking when unset.
func (s *RunSpec) AggregationMode() string {
	if s.Aggregation == "" {
		return AggMasking
	}
	return s.Aggregation
}

// StandardizeMode returns the run's standardisation, federated when unset.
func (s *RunSpec) StandardizeMode() string {
	if s.Trainer != "" {
		return StandardizeNone // a trainer reads its data file as it is
	}
	if s.Standardize == "" {
		return StandardizeFederated
	}
	return s.Standardize
}

// LoadRunSpec reads and checks a run spec.
func LoadRunSpec(path string) (*RunSpec, error) {
	data, err := safefile.ReadFile(path, safefile.MaxConfig)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, diag.New(diag.InvalidValue, "run", "%s is larger than %s, the limit for run files", path, safefile.Size(safefile.MaxConfig))
	}
	if err != nil {
		return nil, diag.New(diag.FileUnreadable, "run", "cannot read %s: %v", path, err).WithHelp("check the path of the run file")
	}
	return ParseRunSpec(path, data)
}

var runKeys = []string{"name", "strategy", "model", "dataset", "rounds", "cohort", "privacy", "secure_aggregation", "aggregation", "masking", "seed", "standardize", "evaluation", "trainer"}

// ParseRunSpec parses a run spec, reporting every problem at once.
func ParseRunSpec(file string, data []byte) (*RunSpec, error) {
	doc, err := yamlpos.Parse(file, data, "run")
	if err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, diag.New(diag.MissingField, "run", "the run file is empty").At(file, 1, 1)
	}
	d := &yamlpos.Decoder{File: file}
	s := &RunSpec{File: file, Params: map[string]any{}, MinCohort: 3, SecureAgg: true, DP: true, Model: ModelSpec{Kind: "logistic"}}
	f := d.Fields(doc, "run", runKeys...)
	if n := d.Required(doc, f, "name", "run"); n != nil {
		s.Name = d.Str(n, "name")
	}
	if n := d.Required(doc, f, "strategy", "run"); n != nil {
		s.parseStrategy(d, n)
	}
	if n := f["model"]; n != nil {
		s.parseModel(d, n)
	}
	if n := d.Required(doc, f, "dataset", "run"); n != nil {
		s.Dataset = d.Str(n, "dataset")
	}
	if n := d.Required(doc, f, "rounds", "run"); n != nil {
		s.Rounds = int(d.Integer(n, "rounds", 1, 100000))
	}
	if n := f["cohort"]; n != nil {
		s.parseCohort(d, n)
	}
	s.parsePrivacy(d, doc, f["privacy"])
	if n := f["secure_aggregation"]; n != nil {
		s.SecureAgg = d.Bool(n, "secure_aggregation")
	}
	s.parseAggregation(d, f["aggregation"], f["masking"])
	if n := f["seed"]; n != nil {
		s.Seed = d.Integer(n, "seed", 0, 1<<62)
	}
	if n := f["standardize"]; n != nil {
		switch v := d.Str(n, "standardize"); v {
		case StandardizeFederated, StandardizeLocal, StandardizeNone:
			s.Standardize = v
		default:
			d.Errorf(n, diag.InvalidValue, "standardize", "use federated (statistics agreed through secure aggregation), local (each silo its own) or none",
				"unknown standardisation %q", v)
		}
	}
	if n := f["evaluation"]; n != nil {
		s.parseEvaluation(d, n)
	}
	if n := f["trainer"]; n != nil {
		s.Trainer = d.Str(n, "trainer")
		parseTrainerRun(d, f, s)
	}
	if s.DP && s.StandardizeMode() == StandardizeFederated && len(s.FeatureBounds) == 0 && f["privacy"] != nil {
		d.Errorf(f["privacy"], diag.MissingField, "privacy.feature_bounds",
			"give privacy.feature_bounds: [B_1, …, B_d], public bounds on each feature's magnitude (see docs/models.md), or standardize: local|none",
			"federated feature statistics under DP need privacy.feature_bounds")
	}
	if s.PublicRows && s.StandardizeMode() != StandardizeFederated {
		d.Errorf(f["privacy"], diag.InvalidValue, "privacy.public_rows",
			"drop public_rows, or standardise with federated statistics (standardize: federated, the default)",
			"privacy.public_rows releases the statistics step's row count, and standardize: %s has no statistics step", s.StandardizeMode())
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// parseStrategy reads the run's strategy: a catalog name or ref, or
// {use, params, class}.
func (s *RunSpec) parseStrategy(d *yamlpos.Decoder, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		s.Strategy = d.Str(n, "strategy")
	} else {
		sf := d.Fields(n, "strategy", "use", "params", "class")
		if u := d.Required(n, sf, "use", "strategy"); u != nil {
			s.Strategy = d.Str(u, "strategy.use")
		}
		if c := sf["class"]; c != nil {
			s.StrategyClass = parseClass(d, c, "strategy.class")
		}
		if p := sf["params"]; p != nil {
			if m, ok := d.Value(p, "strategy.params").(map[string]any); ok {
				s.Params = m
			}
		}
	}
}

// parseModel reads the run's model section.
func (s *RunSpec) parseModel(d *yamlpos.Decoder, n *yaml.Node) {
	mf := d.Fields(n, "model", "kind", "inputs", "classes", "hidden", "image", "conv", "features", "label", "class")
	if c := mf["class"]; c != nil {
		s.Model.Class = parseClass(d, c, "model.class")
	}
	if k := mf["kind"]; k != nil {
		s.Model.Kind = d.Str(k, "model.kind")
	}
	if v := d.Required(n, mf, "inputs", "model"); v != nil {
		s.Model.Inputs = int(d.Integer(v, "model.inputs", 1, 1<<20))
	}
	if v := mf["classes"]; v != nil {
		s.Model.Classes = int(d.Integer(v, "model.classes", 1, 1<<16))
	}
	if h := mf["hidden"]; h != nil {
		// A sanity bound only (the model package bounds the parameter
		// count, 2^26): how large a model a silo trains is its policy's
		// say (policy.max_model_params), not the parser's.
		s.Model.Hidden = int(d.Integer(h, "model.hidden", 1, 1<<26))
	}
	if l := mf["features"]; l != nil {
		seen := map[string]bool{}
		for i, item := range d.Seq(l, "model.features") {
			name := d.Str(item, fmt.Sprintf("model.features[%d]", i))
			if seen[name] {
				d.Errorf(item, diag.ConfigDuplicate, "model.features", "name every feature once", "feature %q is listed twice", name)
			}
			seen[name] = true
			s.Model.Features = append(s.Model.Features, name)
		}
		if len(s.Model.Features) != s.Model.Inputs && s.Model.Inputs > 0 {
			d.Errorf(l, diag.InvalidValue, "model.features", "list exactly model.inputs feature names, in the model's input order",
				"%d feature names for a model of %d inputs", len(s.Model.Features), s.Model.Inputs)
		}
	}
	if l := mf["label"]; l != nil {
		s.Model.Label = d.Str(l, "model.label")
	}
	s.parseCNN(d, n, mf)
}

// parseCNN reads a cnn's image shape and convolution layers, and checks
// the shape they give (every side and channel count at least 1, inputs
// the image's values, a map at least 2×2 before each pooling) with the
// model package's own check. Their size is bounded only by the model
// package's parameter bound; how large a model a silo trains is its
// policy's say (policy.max_model_params).
func (s *RunSpec) parseCNN(d *yamlpos.Decoder, n *yaml.Node, mf map[string]*yaml.Node) {
	img, conv := mf["image"], mf["conv"]
	if s.Model.Kind != model.KindCNN {
		for _, key := range []string{"image", "conv"} {
			if v := mf[key]; v != nil {
				d.Errorf(v, diag.InvalidValue, "model."+key, "drop model."+key+", or train kind: cnn",
					"model.%s is a cnn's, and the model is %s", key, s.Model.Kind)
			}
		}
		return
	}
	before := len(d.Diags)
	if _, ok := s.Params["classes"]; s.Model.Classes == 0 && !ok {
		d.Errorf(n, diag.MissingField, "model.classes", "give model.classes: the number of label classes (every silo must agree on it), 1 for regression",
			"a cnn needs model.classes")
	}
	if img == nil || conv == nil {
		d.Errorf(n, diag.MissingField, "model", "give model.image: [height, width, channels] and model.conv: [channels of each convolution layer], e.g. image: [16, 16, 1], conv: [8, 16]",
			"a cnn needs model.image and model.conv")
		return
	}
	items := d.Seq(img, "model.image")
	if len(items) != 2 && len(items) != 3 {
		d.Errorf(img, diag.InvalidValue, "model.image", "give [height, width] or [height, width, channels]",
			"model.image has %d values", len(items))
		return
	}
	for i, item := range items {
		s.Model.Image = append(s.Model.Image, int(d.Integer(item, fmt.Sprintf("model.image[%d]", i), 1, 1<<20)))
	}
	if len(s.Model.Image) == 2 {
		s.Model.Image = append(s.Model.Image, 1)
	}
	for i, item := range d.Seq(conv, "model.conv") {
		s.Model.Conv = append(s.Model.Conv, int(d.Integer(item, fmt.Sprintf("model.conv[%d]", i), 1, 1<<20)))
	}
	if len(s.Model.Conv) == 0 {
		d.Errorf(conv, diag.InvalidValue, "model.conv", "list the output channels of each convolution layer, e.g. [8, 16]",
			"model.conv is empty")
	}
	if len(d.Diags) > before {
		return
	}
	classes := s.Model.Classes
	if classes == 0 {
		classes = 2 // the shape's check; the strategy requires the classes
	}
	spec := model.Spec{Kind: model.KindCNN, Inputs: s.Model.Inputs, Classes: classes, Hidden: s.Model.Hidden,
		Image: [3]int(s.Model.Image), Conv: s.Model.Conv}
	if err := spec.Validate(); err != nil {
		var dg *diag.Diagnostic
		if errors.As(err, &dg) {
			d.Errorf(img, dg.Code, "model", dg.Help, "%s", dg.Message)
		} else {
			d.Errorf(img, diag.InvalidValue, "model", "", "%v", err)
		}
	}
}

// parseCohort reads the run's cohort section.
func (s *RunSpec) parseCohort(d *yamlpos.Decoder, n *yaml.Node) {
	cf := d.Fields(n, "cohort", "silos", "min", "sample", "stragglers", "buffer")
	if v := cf["buffer"]; v != nil {
		s.Buffer = int(d.Integer(v, "cohort.buffer", 3, 100000))
	}
	if v := cf["sample"]; v != nil {
		s.Sample = d.Number(v, "cohort.sample", 1e-6, 1)
	}
	if v := cf["stragglers"]; v != nil {
		s.Stragglers = d.Number(v, "cohort.stragglers", 0, 1)
	}
	if l := cf["silos"]; l != nil {
		for i, item := range d.Seq(l, "cohort.silos") {
			s.Silos = append(s.Silos, d.Str(item, fmt.Sprintf("cohort.silos[%d]", i)))
		}
	}
	if m := cf["min"]; m != nil {
		s.MinCohort = int(d.Integer(m, "cohort.min", 3, 255))
	}
}

// parsePrivacy reads the run's privacy section (n, nil without one: DP
// on then needs it). The model's inputs are read already.
func (s *RunSpec) parsePrivacy(d *yamlpos.Decoder, doc, n *yaml.Node) {
	if n != nil {
		pf := d.Fields(n, "privacy", "dp", "clip", "sigma", "q", "participation", "steps", "feature_bounds", "sums_sigma", "eval_sigma", "public_rows")
		if v := pf["dp"]; v != nil {
			s.DP = d.Bool(v, "privacy.dp")
		}
		if v := pf["clip"]; v != nil {
			s.Clip = d.Number(v, "privacy.clip", 1e-9, 1e9)
		}
		if v := pf["sigma"]; v != nil {
			s.Sigma = d.Number(v, "privacy.sigma", 1e-6, 1e6)
		}
		if v := pf["q"]; v != nil {
			s.Q = d.Number(v, "privacy.q", 1e-9, 1)
		}
		if v := pf["participation"]; v != nil {
			s.Participation = d.Number(v, "privacy.participation", 1e-9, 1)
		}
		if v := pf["steps"]; v != nil {
			s.Steps = int(d.Integer(v, "privacy.steps", 1, 1<<30))
		}
		if v := pf["sums_sigma"]; v != nil {
			s.SumsSigma = d.Number(v, "privacy.sums_sigma", 1e-6, 1e6)
		}
		if v := pf["eval_sigma"]; v != nil {
			s.EvalSigma = d.Number(v, "privacy.eval_sigma", 1e-6, 1e6)
		}
		if v := pf["public_rows"]; v != nil {
			s.PublicRows = d.Bool(v, "privacy.public_rows")
		}
		if l := pf["feature_bounds"]; l != nil {
			s.FeatureCenters, s.FeatureBounds = parseBounds(d, l)
			if len(s.FeatureBounds) != s.Model.Inputs {
				d.Errorf(l, diag.InvalidValue, "privacy.feature_bounds", "give one bound per model input, in the model's input order",
					"%d feature bounds for a model of %d inputs", len(s.FeatureBounds), s.Model.Inputs)
			}
		}
		if s.DP && (s.Clip == 0 || s.Sigma == 0) {
			d.Errorf(n, diag.MissingField, "privacy", "give clip and sigma (scellis privacy calibrate picks sigma for a target ε), or dp: false in an own pool",
				"privacy needs clip and sigma when DP is on")
		}
	} else if s.DP {
		d.Errorf(doc, diag.MissingField, "run", "add privacy: {clip: C, sigma: S, q: Q, steps: T}, or privacy: {dp: false} in an own pool",
			"the run has no privacy parameters")
	}
}

// parseAggregation reads how the run's sum is formed: aggregation (masking
// or threshold-he) and masking (the protocol), after secure_aggregation.
func (s *RunSpec) parseAggregation(d *yamlpos.Decoder, aggregation, masking *yaml.Node) {
	if n := aggregation; n != nil {
		switch v := d.Str(n, "aggregation"); v {
		case AggMasking:
		case AggThresholdHE:
			s.Aggregation = v
			if !s.SecureAgg {
				d.Errorf(n, diag.InvalidValue, "aggregation", "drop aggregation, or turn secure_aggregation on",
					"aggregation: threshold-he with secure_aggregation: false")
			}
		default:
			d.Errorf(n, diag.InvalidValue, "aggregation", "use masking (pairwise masks, the default) or threshold-he (threshold homomorphic encryption; docs/secagg.md says which to pick)",
				"unknown aggregation mode %q", v)
		}
	}
	if n := masking; n != nil {
		switch v := d.Str(n, "masking"); secagg.Protocol(v) {
		case secagg.Pairwise, secagg.SecAggPlus:
			s.Masking = v
			if !s.SecureAgg || s.AggregationMode() != AggMasking {
				d.Errorf(n, diag.InvalidValue, "masking", "drop masking, or run secure_aggregation: true with aggregation: masking",
					"masking: %s without masked secure aggregation", v)
			}
		default:
			d.Errorf(n, diag.InvalidValue, "masking", "use pairwise (every pair of sites) or secagg+ (k = O(log n) neighbours; docs/secagg.md, \"SecAgg+\")",
				"unknown masking protocol %q", v)
		}
	}
}

// parseEvaluation reads the run's evaluation section.
func (s *RunSpec) parseEvaluation(d *yamlpos.Decoder, n *yaml.Node) {
	ef := d.Fields(n, "evaluation", "holdout", "dataset", "every")
	if v := ef["holdout"]; v != nil {
		s.Eval.Holdout = d.Number(v, "evaluation.holdout", 0, 0.9)
	}
	if v := ef["dataset"]; v != nil {
		s.Eval.Dataset = d.Str(v, "evaluation.dataset")
	}
	if v := ef["every"]; v != nil {
		s.Eval.Every = int(d.Integer(v, "evaluation.every", 1, 100000))
		if s.Eval.Holdout == 0 && s.Eval.Dataset == "" {
			d.Errorf(v, diag.MissingField, "evaluation.every", "give evaluation.holdout: F or evaluation.dataset: NAME, the rows the model is scored on",
				"evaluation.every without held-out rows to evaluate on")
		}
	}
	if s.Eval.Holdout > 0 && s.Eval.Dataset != "" {
		d.Errorf(n, diag.InvalidValue, "evaluation", "give holdout: F or dataset: NAME, not both",
			"evaluation names both a held-out fraction and a dataset")
	}
}

// Privacy returns the engine's DP settings for a silo whose dataset has
// the given unit.
func (s *RunSpec) Privacy(unit Unit) Privacy {
	if !s.DP {
		return Privacy{}
	}
	return Privacy{Unit: unit, SampleRate: s.Q, Participation: s.Participation, Clip: s.Clip, Sigma: s.Sigma, Steps: s.Steps}
}

// StepPrivacy is Privacy for one step: the statistics and evaluation
// steps release at SumsSigma when the run sets it, an evaluation step at
// EvalSigma when that is set.
func (s *RunSpec) StepPrivacy(unit Unit, step string) Privacy {
	p := s.Privacy(unit)
	if p.Unit == UnitNone {
		return p
	}
	p.Sigma = s.StepSigma(step)
	return p
}

// StepSigma is the noise multiplier a step of the run releases at under
// DP: Sigma for training, SumsSigma (if set) for the statistics and
// evaluation steps, EvalSigma (if set) for evaluation.
func (s *RunSpec) StepSigma(step string) float64 {
	switch {
	case step == StepEval && s.EvalSigma > 0:
		return s.EvalSigma
	case (step == StepStats || step == StepEval) && s.SumsSigma > 0:
		return s.SumsSigma
	}
	return s.Sigma
}

// StatsDP is how the run's statistics step released its sums under DP,
// summed over sites silos (nil without DP: the sums are exact).
func (s *RunSpec) StatsDP(sites int) *StatsDP {
	if !s.DP {
		return nil
	}
	c := len(s.FeatureBounds)
	return &StatsDP{Bounds: s.Bounds(), PublicRows: s.PublicRows,
		Noise: StatsNoise(s.StepSigma(StepStats), c, sites, s.PublicRows)}
}

// Bounds are the run's public feature ranges (privacy.feature_bounds).
func (s *RunSpec) Bounds() Bounds {
	return Bounds{Center: s.FeatureCenters, Half: s.FeatureBounds}
}

// Canonical is the run as it is hashed and shipped: the strategy resolved
// to its content ref.
type Canonical struct {
	Format   string      `cbor:"format" json:"format"`
	Spec     RunSpec     `cbor:"spec" json:"spec"`
	Strategy content.Ref `cbor:"strategy_ref" json:"strategy_ref"`
	// Trainer is the content hash of the run's trainer bundle (the blob
	// silos fetch and their policies allow), when it has one.
	Trainer content.Ref `cbor:"trainer_ref,omitempty" json:"trainer_ref,omitempty"`
	// TrainerParams is the number of weights of the trainer's model (its
	// init.npy): what a silo's policy.max_model_params bounds before it
	// fetches the trainer, and what the trainer's layout must match.
	TrainerParams int `cbor:"trainer_params,omitempty" json:"trainer_params,omitempty"`
	// TrainerBundle is the trainer Resolve loaded, for the launcher to
	// upload; never hashed.
	TrainerBundle *trainer.Bundle `cbor:"-" json:"-"`
}

const runFormat = "scellis/run/v1"

// Resolve resolves the strategy against a catalog and returns the run's
// canonical form and ID (the hash of its canonical encoding).
func (s *RunSpec) Resolve(c *catalog.Catalog, baseDir string) (*Canonical, content.Ref, *Strategy, error) {
	st, err := Load(c, s.Strategy, baseDir, s.Params)
	if err != nil {
		return nil, "", nil, err
	}
	cs := &Canonical{Format: runFormat, Spec: *s, Strategy: st.Entry.Ref}
	cs.Spec.Strategy = st.Entry.Name
	if err := s.checkTrainerStrategy(st); err != nil {
		return nil, "", nil, err
	}
	if s.Trainer != "" {
		if cs.TrainerBundle, cs.Trainer, err = s.LoadTrainer(baseDir); err != nil {
			return nil, "", nil, err
		}
		w, _, _ := cs.TrainerBundle.Init() // LoadTrainer checked it
		cs.TrainerParams = len(w)
		cs.Spec.Trainer = filepath.Base(filepath.Clean(s.Trainer))
	}
	id, err := content.HashOf(cs)
	if err != nil {
		return nil, "", nil, err
	}
	return cs, id, st, nil
}

// parseBounds reads privacy.feature_bounds: each item a bound B (the
// range [−B, B]) or a range [lo, hi] with lo < hi; it returns the ranges'
// centres (nil when all are 0) and half-widths.
func parseBounds(d *yamlpos.Decoder, l *yaml.Node) (centers, halves []float64) {
	centred := false
	for i, item := range d.Seq(l, "privacy.feature_bounds") {
		subject := fmt.Sprintf("privacy.feature_bounds[%d]", i)
		c, h := 0.0, 0.0
		if item.Kind != yaml.SequenceNode {
			h = d.Number(item, subject, 1e-9, 1e15)
		} else if len(item.Content) != 2 {
			d.Errorf(item, diag.InvalidValue, subject, "give a bound B (the range [−B, B]) or a range [lo, hi]",
				"a range of %d values", len(item.Content))
		} else {
			lo, hi := d.Number(item.Content[0], subject, -1e15, 1e15), d.Number(item.Content[1], subject, -1e15, 1e15)
			if !(hi-lo >= 1e-9) {
				d.Errorf(item, diag.InvalidValue, subject, "give the range as [lo, hi] with lo below hi",
					"range [%g, %g] is empty", lo, hi)
			}
			c, h = (lo+hi)/2, (hi-lo)/2
		}
		centers, halves = append(centers, c), append(halves, h)
		centred = centred || c != 0
	}
	if !centred {
		centers = nil // symmetric bounds hash as they always have
	}
	return centers, halves
}

// parseClass reads a class (public or confidential) at n; an unknown one
// is SC4005 at its position.
func parseClass(d *yamlpos.Decoder, n *yaml.Node, subject string) trust.Class {
	c, err := trust.ParseClass(d.Str(n, subject))
	if err != nil && n.Tag == "!!str" {
		dg := err.(*diag.Diagnostic)
		dg.Subject = subject
		d.Diags = append(d.Diags, dg.At(d.File, n.Line, n.Column))
	}
	return c
}

// Classed is what the run declares classed: its model and strategy, for
// admission (a confidential one refuses an open pool).
func (s *RunSpec) Classed() []trust.Item {
	var out []trust.Item
	if s.Model.Class != "" {
		out = append(out, trust.Item{Name: "the run's model", Class: s.Model.Class})
	}
	if s.StrategyClass != "" {
		out = append(out, trust.Item{Name: "strategy " + s.Strategy, Class: s.StrategyClass})
	}
	return out
}
