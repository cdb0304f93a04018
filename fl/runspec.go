package fl

import (
	"errors"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
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
//	seed: 7
type RunSpec struct {
	Name      string         `cbor:"name" json:"name"`
	Strategy  string         `cbor:"strategy" json:"strategy"` // catalog name, path or ref as written
	Params    map[string]any `cbor:"params" json:"params"`
	Model     ModelSpec      `cbor:"model" json:"model"`
	Dataset   string         `cbor:"dataset" json:"dataset"`
	Rounds    int            `cbor:"rounds" json:"rounds"`
	Silos     []string       `cbor:"silos" json:"silos"` // empty: every silo of the federation
	MinCohort int            `cbor:"min_cohort" json:"min_cohort"`
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
	Seed          int64   `cbor:"seed" json:"seed"`

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

var runKeys = []string{"name", "strategy", "model", "dataset", "rounds", "cohort", "privacy", "secure_aggregation", "seed"}

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
		if n.Kind == yaml.ScalarNode {
			s.Strategy = d.Str(n, "strategy")
		} else {
			sf := d.Fields(n, "strategy", "use", "params")
			if u := d.Required(n, sf, "use", "strategy"); u != nil {
				s.Strategy = d.Str(u, "strategy.use")
			}
			if p := sf["params"]; p != nil {
				if m, ok := d.Value(p, "strategy.params").(map[string]any); ok {
					s.Params = m
				}
			}
		}
	}
	if n := f["model"]; n != nil {
		mf := d.Fields(n, "model", "kind", "inputs", "classes", "hidden")
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
			s.Model.Hidden = int(d.Integer(h, "model.hidden", 1, 4096))
		}
	}
	if n := d.Required(doc, f, "dataset", "run"); n != nil {
		s.Dataset = d.Str(n, "dataset")
	}
	if n := d.Required(doc, f, "rounds", "run"); n != nil {
		s.Rounds = int(d.Integer(n, "rounds", 1, 100000))
	}
	if n := f["cohort"]; n != nil {
		cf := d.Fields(n, "cohort", "silos", "min")
		if l := cf["silos"]; l != nil {
			for i, item := range d.Seq(l, "cohort.silos") {
				s.Silos = append(s.Silos, d.Str(item, fmt.Sprintf("cohort.silos[%d]", i)))
			}
		}
		if m := cf["min"]; m != nil {
			s.MinCohort = int(d.Integer(m, "cohort.min", 3, 255))
		}
	}
	if n := f["privacy"]; n != nil {
		pf := d.Fields(n, "privacy", "dp", "clip", "sigma", "q", "participation", "steps")
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
		if s.DP && (s.Clip == 0 || s.Sigma == 0) {
			d.Errorf(n, diag.MissingField, "privacy", "give clip and sigma (scellis privacy calibrate picks sigma for a target ε), or dp: false in an own pool",
				"privacy needs clip and sigma when DP is on")
		}
	} else if s.DP {
		d.Errorf(doc, diag.MissingField, "run", "add privacy: {clip: C, sigma: S, q: Q, steps: T}, or privacy: {dp: false} in an own pool",
			"the run has no privacy parameters")
	}
	if n := f["secure_aggregation"]; n != nil {
		s.SecureAgg = d.Bool(n, "secure_aggregation")
	}
	if n := f["seed"]; n != nil {
		s.Seed = d.Integer(n, "seed", 0, 1<<62)
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// Privacy returns the engine's DP settings for a silo whose dataset has
// the given unit.
func (s *RunSpec) Privacy(unit Unit) Privacy {
	if !s.DP {
		return Privacy{}
	}
	return Privacy{Unit: unit, SampleRate: s.Q, Participation: s.Participation, Clip: s.Clip, Sigma: s.Sigma, Steps: s.Steps}
}

// Canonical is the run as it is hashed and shipped: the strategy resolved
// to its content ref.
type Canonical struct {
	Format   string      `cbor:"format" json:"format"`
	Spec     RunSpec     `cbor:"spec" json:"spec"`
	Strategy content.Ref `cbor:"strategy_ref" json:"strategy_ref"`
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
	id, err := content.HashOf(cs)
	if err != nil {
		return nil, "", nil, err
	}
	return cs, id, st, nil
}
