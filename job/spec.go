package job

import (
	"errors"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify"
)

// Spec is a job as a person writes it (YAML). It names content by catalog
// name, path or ref; Compile resolves those into refs and the job ID.
type Spec struct {
	Name             string
	Description      string
	Regime           trust.Regime
	SecurityCritical bool
	Program          string
	Partitioner      Use
	Reducer          Use
	Params           map[string]any
	Inputs           map[string]Input
	Verification     Verification
	Limits           Limits
	// Classes marks what the job runs as classed: "content" (its program,
	// partitioner, reducer and libraries) and "model" (the model its
	// program trains or scores). Admission refuses confidential ones on an
	// open pool (SC4003): executing peers hold what they compute with.
	Classes map[string]trust.Class

	// File is the spec's path; relative paths in the spec resolve against
	// its folder. Empty for specs that did not come from a file.
	File string
	// pos remembers where fields were written, for later diagnostics.
	pos map[string]diag.Position
	// fetched marks a spec compiled from a bundle, whose input files came
	// from a remote submitter: diagnostics about them never quote them.
	fetched bool
}

// Use names a piece of content and the parameters handed to it.
type Use struct {
	Ref    string
	Params map[string]any
}

// Input is a data file a job reads. Only the file's hash enters the job ID,
// so moving the file does not change the job; editing it does.
type Input struct {
	Path  string
	Label string
	Class trust.Class
}

// Verification is the job's verification policy. Its canonical encoding
// enters the job ID; the fields added with the tiers are omitted when
// empty, so jobs that do not use them keep their IDs.
type Verification struct {
	// Replicas is how many distinct peers must agree on a shard's result
	// (0: the pool's default): byte-for-byte in the replayable tier,
	// within Tolerance in the convergent tier.
	Replicas int
	// Tolerance is the convergent tier's allowed absolute difference
	// (`tolerance: 1e-9`, or `tolerance: {abs: ...}`).
	Tolerance float64
	// Attempts bounds executions of one shard before it is flagged unverified.
	Attempts int
	// Tier is "replayable" or "convergent"; empty is replayable unless a
	// tolerance is given, which declares the convergent tier.
	Tier string `cbor:",omitempty"`
	// RelTolerance is the convergent tier's allowed relative difference.
	RelTolerance float64 `cbor:",omitempty"`
	// Per is what the tolerance bounds: "tensor" (default) or "metric".
	Per string `cbor:",omitempty"`
	// Freivalds, when > 0, verifies each shard's matrix product with that
	// many Freivalds rounds on a verifier peer (the program's verify
	// function) instead of re-executing it.
	Freivalds int `cbor:",omitempty"`
	// Mode is "quorum" (default: every shard needs Replicas agreeing
	// peers) or "adaptive" (spot checks by reputation, canaries and
	// replacement; see docs/verification.md).
	Mode string `cbor:",omitempty"`
	// Canaries is the share of a job's shards the planner computes
	// beforehand as known answers (0: the default, 5% for an adaptive job
	// or any exact job on an open pool, none otherwise).
	Canaries float64 `cbor:",omitempty"`
	// TrustAfter and AuditOneIn tune an adaptive job's spot checks: a
	// peer runs shards alone after this many consecutive valid checks,
	// then is audited one shard in AuditOneIn (0: the pool's, 5 and 5).
	TrustAfter int `cbor:",omitempty"`
	AuditOneIn int `cbor:",omitempty"`
}

// EffectiveTier is the tier the job runs under: the declared one, or
// convergent when only a tolerance was given.
func (v Verification) EffectiveTier() verify.Tier {
	t, err := verify.ParseTier(v.Tier)
	if err != nil {
		return verify.Tier(v.Tier)
	}
	if v.Tier == "" && (v.Tolerance > 0 || v.RelTolerance > 0) {
		return verify.Convergent
	}
	return t
}

// Tol is the declared tolerance.
func (v Verification) Tol() verify.Tolerance {
	return verify.Tolerance{Abs: v.Tolerance, Rel: v.RelTolerance, Per: v.Per}
}

// Limits bound each content call.
type Limits struct {
	Steps    uint64
	MemoryMB uint64
}

// BaseDir is the folder relative paths in the spec resolve against.
func (s *Spec) BaseDir() string {
	if s.File == "" {
		return "."
	}
	return filepath.Dir(s.File)
}

// Pos returns where a field (e.g. "program", "inputs.data.path") was written.
func (s *Spec) Pos(field string) *diag.Position {
	if p, ok := s.pos[field]; ok {
		return &p
	}
	if s.File != "" {
		return &diag.Position{File: s.File}
	}
	return nil
}

// at positions d at a field of the spec.
func (s *Spec) at(d *diag.Diagnostic, field string) *diag.Diagnostic {
	d.Pos = s.Pos(field)
	return d
}

var (
	topKeys = []string{"name", "description", "regime", "security_critical", "program", "partitioner", "reducer", "params", "inputs", "verification", "limits", "classes"}
	// ClassKeys are what a job's classes may name.
	ClassKeys  = []string{"content", "model"}
	useKeys    = []string{"use", "params"}
	inputKeys  = []string{"path", "label", "class"}
	verifyKeys = []string{"tier", "replicas", "tolerance", "attempts", "freivalds", "mode", "canaries", "trust_after", "audit_one_in"}
	tolKeys    = []string{"abs", "rel", "per"}
	limitKeys  = []string{"steps", "memory_mb"}
)

// maxSpecBytes bounds a job file; specs are small, data lives in inputs.
const maxSpecBytes = 1 << 20

// LoadSpec reads and parses a job file.
func LoadSpec(path string) (*Spec, error) {
	data, err := safefile.ReadFile(path, maxSpecBytes)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, diag.New(diag.InvalidValue, "job", "%s is larger than %s, the limit for job files", path, safefile.Size(maxSpecBytes)).
			WithHelp("keep data in inputs, not in the job file")
	}
	if err != nil {
		msg := err.Error()
		var pe *os.PathError
		if errors.As(err, &pe) {
			msg = pe.Err.Error()
		}
		return nil, diag.New(diag.FileUnreadable, "job", "cannot read %s: %s", path, msg).
			WithHelp("check the path of the job file")
	}
	return ParseSpec(path, data)
}

// decoder adds the job spec's shapes to the shared positioned decoder.
type decoder struct{ yamlpos.Decoder }

// ParseSpec parses a job spec, reporting every problem at once.
func ParseSpec(file string, data []byte) (*Spec, error) {
	if len(data) > maxSpecBytes {
		return nil, diag.New(diag.InvalidValue, "job", "job spec is %d bytes; the limit is %d", len(data), maxSpecBytes)
	}
	doc, err := yamlpos.Parse(file, data, "job")
	if err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, diag.New(diag.MissingField, "job", "the job file is empty").At(file, 1, 1).
			WithHelp("a job needs at least name, program and partitioner")
	}
	d := &decoder{yamlpos.Decoder{File: file}}
	// An empty regime means "the pool's": a solo run is own, a submitted
	// job takes the regime of the pool it is submitted to.
	s := &Spec{File: file, pos: map[string]diag.Position{}}
	f := d.Fields(doc, "job", topKeys...)
	for k, v := range f {
		s.pos[k] = diag.Position{File: file, Line: v.Line, Col: v.Column}
	}
	required := func(key string) *yaml.Node { return d.Required(doc, f, key, "job") }
	if n := required("name"); n != nil {
		s.Name = d.Str(n, "name")
	}
	if n := f["description"]; n != nil {
		s.Description = d.Str(n, "description")
	}
	if n := f["regime"]; n != nil {
		r, err := trust.ParseRegime(d.Str(n, "regime"))
		if err != nil && n.Tag == "!!str" {
			dg := err.(*diag.Diagnostic)
			dg.At(file, n.Line, n.Column)
			d.Diags = append(d.Diags, dg)
		}
		s.Regime = r
	}
	if n := f["security_critical"]; n != nil {
		s.SecurityCritical = d.Bool(n, "security_critical")
	}
	if n := required("program"); n != nil {
		s.Program = d.Str(n, "program")
	}
	if n := required("partitioner"); n != nil {
		s.Partitioner = d.use(n, "partitioner")
	}
	if n := f["reducer"]; n != nil {
		s.Reducer = d.use(n, "reducer")
	} else {
		s.Reducer = Use{Ref: "collect", Params: map[string]any{}}
	}
	s.Params = map[string]any{}
	if n := f["params"]; n != nil {
		s.Params = d.mapping(n, "params")
	}
	s.Inputs = map[string]Input{}
	if n := f["inputs"]; n != nil {
		if n.Kind != yaml.MappingNode {
			d.Errorf(n, diag.WrongType, "inputs", "give a mapping of input names to {path, label, class}", "inputs must be a mapping, not %s", yamlpos.KindName(n))
		}
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			name, v := n.Content[i].Value, n.Content[i+1]
			if _, dup := s.Inputs[name]; dup {
				d.Errorf(n.Content[i], diag.ConfigDuplicate, "inputs", "remove one of them", "input %q given twice", name)
				continue
			}
			s.Inputs[name] = d.input(v, "inputs."+name, s)
		}
	}
	if n := f["verification"]; n != nil {
		s.parseVerification(d, n)
	}
	if n := f["classes"]; n != nil {
		s.Classes = map[string]trust.Class{}
		for k, v := range d.Fields(n, "classes", ClassKeys...) {
			c, err := trust.ParseClass(d.Str(v, "classes."+k))
			if err != nil && v.Tag == "!!str" {
				dg := err.(*diag.Diagnostic)
				dg.Subject = "classes." + k
				d.Diags = append(d.Diags, dg.At(file, v.Line, v.Column))
			}
			s.Classes[k] = c
		}
	}
	if n := f["limits"]; n != nil {
		lf := d.Fields(n, "limits", limitKeys...)
		if v := lf["steps"]; v != nil {
			s.Limits.Steps = uint64(d.Integer(v, "limits.steps", 1000, 1<<50))
		}
		if v := lf["memory_mb"]; v != nil {
			s.Limits.MemoryMB = uint64(d.Integer(v, "limits.memory_mb", 1, 1<<20))
		}
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// parseVerification reads the job's verification section: how its shards'
// results are checked (replicas, tier and tolerance, adaptive spot checks).
func (s *Spec) parseVerification(d *decoder, n *yaml.Node) {
	vf := d.Fields(n, "verification", verifyKeys...)
	if v := vf["replicas"]; v != nil {
		s.Verification.Replicas = int(d.Integer(v, "verification.replicas", 1, 16))
	}
	if v := vf["tier"]; v != nil {
		s.Verification.Tier = d.Str(v, "verification.tier")
		if _, err := verify.ParseTier(s.Verification.Tier); err != nil && v.Tag == "!!str" {
			d.Errorf(v, diag.InvalidValue, "verification.tier", "use replayable (byte-exact) or convergent (within a tolerance)", "%v", err)
		}
	}
	if v := vf["tolerance"]; v != nil {
		if v.Kind == yaml.MappingNode {
			tf := d.Fields(v, "verification.tolerance", tolKeys...)
			if n := tf["abs"]; n != nil {
				s.Verification.Tolerance = d.Number(n, "verification.tolerance.abs", 0, 1e9)
			}
			if n := tf["rel"]; n != nil {
				s.Verification.RelTolerance = d.Number(n, "verification.tolerance.rel", 0, 1e9)
			}
			if n := tf["per"]; n != nil {
				s.Verification.Per = d.Str(n, "verification.tolerance.per")
				if p := s.Verification.Per; p != verify.PerTensor && p != verify.PerMetric && n.Tag == "!!str" {
					d.Errorf(n, diag.InvalidValue, "verification.tolerance.per", "use tensor (each list as a whole) or metric (each number)", "unknown granularity %q", p)
				}
			}
		} else {
			s.Verification.Tolerance = d.Number(v, "verification.tolerance", 0, 1e9)
		}
	}
	if v := vf["freivalds"]; v != nil {
		s.Verification.Freivalds = int(d.Integer(v, "verification.freivalds", 1, verify.MaxFreivaldsRounds))
	}
	if v := vf["attempts"]; v != nil {
		s.Verification.Attempts = int(d.Integer(v, "verification.attempts", 1, 100))
	}
	if v := vf["mode"]; v != nil {
		s.Verification.Mode = d.Str(v, "verification.mode")
		if m := s.Verification.Mode; m != "quorum" && m != "adaptive" && v.Tag == "!!str" {
			d.Errorf(v, diag.InvalidValue, "verification.mode", "use quorum (every shard replicated) or adaptive (spot checks by reputation, with canaries)", "unknown verification mode %q", m)
		}
	}
	if v := vf["canaries"]; v != nil {
		s.Verification.Canaries = d.Number(v, "verification.canaries", 0, 0.5)
	}
	for _, k := range []struct {
		key string
		to  *int
	}{{"trust_after", &s.Verification.TrustAfter}, {"audit_one_in", &s.Verification.AuditOneIn}} {
		v := vf[k.key]
		if v == nil {
			continue
		}
		*k.to = int(d.Integer(v, "verification."+k.key, 1, 1000))
		if s.Verification.Mode != "adaptive" {
			d.Errorf(v, diag.InvalidValue, "verification."+k.key, "set verification.mode: adaptive, or remove "+k.key, "spot-check knobs tune adaptive jobs only")
		}
	}
}

func (d *decoder) use(n *yaml.Node, subject string) Use {
	if n.Kind == yaml.ScalarNode {
		return Use{Ref: d.Str(n, subject), Params: map[string]any{}}
	}
	f := d.Fields(n, subject, useKeys...)
	u := Use{Params: map[string]any{}}
	if v, ok := f["use"]; ok {
		u.Ref = d.Str(v, subject+".use")
	} else if n.Kind == yaml.MappingNode {
		d.Errorf(n, diag.MissingField, subject, "name the content with use: NAME (see scellis catalog ls)", "%s needs a \"use\" key", subject)
	}
	if v, ok := f["params"]; ok {
		u.Params = d.mapping(v, subject+".params")
	}
	return u
}

func (d *decoder) mapping(n *yaml.Node, subject string) map[string]any {
	if n.Kind != yaml.MappingNode {
		d.Errorf(n, diag.WrongType, subject, "", "%s must be a mapping, not %s", subject, yamlpos.KindName(n))
		return map[string]any{}
	}
	m, _ := d.Value(n, subject).(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	return m
}

func (d *decoder) input(n *yaml.Node, subject string, s *Spec) Input {
	f := d.Fields(n, subject, inputKeys...)
	in := Input{Class: trust.Confidential}
	for k, v := range f {
		s.pos[subject+"."+k] = diag.Position{File: d.File, Line: v.Line, Col: v.Column}
	}
	s.pos[subject] = diag.Position{File: d.File, Line: n.Line, Col: n.Column}
	if v, ok := f["path"]; ok {
		in.Path = d.Str(v, subject+".path")
	} else if n.Kind == yaml.MappingNode {
		d.Errorf(n, diag.MissingField, subject, "add path: FILE.csv", "%s needs a path", subject)
	}
	if v, ok := f["label"]; ok {
		in.Label = d.Str(v, subject+".label")
	} else if n.Kind == yaml.MappingNode {
		d.Errorf(n, diag.MissingField, subject, "add label: COLUMN (the CSV column to predict)", "%s needs a label column", subject)
	}
	if v, ok := f["class"]; ok {
		c, err := trust.ParseClass(d.Str(v, subject+".class"))
		if err != nil && v.Tag == "!!str" {
			dg := err.(*diag.Diagnostic)
			dg.At(d.File, v.Line, v.Column)
			d.Diags = append(d.Diags, dg)
		}
		in.Class = c
	}
	return in
}
