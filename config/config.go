// Package config loads the appliances' config files (aggregator, worker,
// silo) into typed structs: YAML with positions, environment overrides
// through viper (SCELLIS_<KEY>, dots as underscores, so a nested key
// policy.min_cohort is SCELLIS_POLICY_MIN_COHORT), unknown keys rejected at
// every level, and every problem reported at once as diagnostics with
// file:line:col. Relative paths resolve against the config file's folder.
// One mechanism decodes them all: a list of fields, each a leaf, a nested
// section, or a list or mapping of named sections.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
)

// field describes one config key: its name, where it goes, how to parse it.
// A field is a leaf (parser.set and parser.fromEnv), a nested section
// (parser.sub) or a list or mapping of named sections of one shape
// (parser.item); see section and sections.
type field struct {
	key      string
	required bool
	help     string
	parser
}

// parser reads one key's value from YAML or from an environment variable.
type parser struct {
	set     func(d *yamlpos.Decoder, n *yaml.Node, subject string)
	fromEnv func(s string) error
	// sub holds the fields of a nested section.
	sub []field
	// item returns the fields of one named entry of a list or mapping of
	// sections; what names an entry in messages ("dataset").
	item func(name string) []field
	what string
}

func str(p *string) parser {
	return parser{
		set:     func(d *yamlpos.Decoder, n *yaml.Node, subject string) { *p = d.Str(n, subject) },
		fromEnv: func(s string) error { *p = s; return nil },
	}
}

// strs reads a list of strings, each checked by check (nil accepts any);
// from the environment, a comma- or space-separated list.
func strs(p *[]string, check func(string) error) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) {
			out := []string{}
			for i, it := range d.Seq(n, subject) {
				sub := fmt.Sprintf("%s[%d]", subject, i)
				s := d.Str(it, sub)
				if s == "" {
					continue
				}
				if check != nil {
					if err := check(s); err != nil {
						d.Diags = append(d.Diags, refusal(err, d.File, it, sub, s, nil))
						continue
					}
				}
				out = append(out, s)
			}
			if n.Kind == yaml.SequenceNode {
				*p = out
			}
		},
		fromEnv: func(s string) error {
			out := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
			for _, x := range out {
				if check != nil {
					if err := check(x); err != nil {
						return err
					}
				}
			}
			*p = out
			return nil
		},
	}
}

// parsed reads a string and hands it to parse, which stores it or says why
// it is refused. A *diag.Diagnostic from parse keeps its code and help
// (positioned at the value); allowed, when given, adds a did-you-mean hint.
func parsed(parse func(s string) error, allowed ...string) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) {
			if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
				d.Str(n, subject) // reports the wrong type
				return
			}
			if err := parse(n.Value); err != nil {
				d.Diags = append(d.Diags, refusal(err, d.File, n, subject, n.Value, allowed))
			}
		},
		fromEnv: parse,
	}
}

// number reads a finite number and checks it with check (nil accepts any).
func number(p *float64, check func(float64) error) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) {
			bad := len(d.Diags)
			v := d.Number(n, subject, -math.MaxFloat64, math.MaxFloat64) // finite: .inf is refused
			if len(d.Diags) > bad {
				return
			}
			if check != nil {
				if err := check(v); err != nil {
					d.Diags = append(d.Diags, refusal(err, d.File, n, subject, n.Value, nil))
					return
				}
			}
			*p = v
		},
		fromEnv: func(s string) error {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("want a finite number")
			}
			if check != nil {
				if err := check(v); err != nil {
					return err
				}
			}
			*p = v
			return nil
		},
	}
}

// refusal turns a parse or check error into a diagnostic at n.
func refusal(err error, file string, n *yaml.Node, subject, value string, allowed []string) *diag.Diagnostic {
	var dg *diag.Diagnostic
	if errors.As(err, &dg) {
		c := *dg
		dg = &c
		dg.Subject = subject
	} else {
		dg = diag.New(diag.InvalidValue, subject, "%s", err.Error())
	}
	dg.At(file, n.Line, n.Column)
	if s := diag.Suggest(value, allowed); s != "" {
		help := fmt.Sprintf("did you mean %q?", s)
		if dg.Help != "" {
			help += " " + dg.Help
		}
		dg.Help = help
	} else if dg.Help == "" && len(allowed) > 0 {
		dg.Help = "use one of: " + strings.Join(allowed, ", ")
	}
	return dg
}

// envRefusal is refusal for a value from the environment variable of key.
func envRefusal(err error, subject, key, value string) *diag.Diagnostic {
	var dg *diag.Diagnostic
	if errors.As(err, &dg) {
		c := *dg
		c.Subject = key
		c.Message = fmt.Sprintf("environment %s = %q: %s", EnvName(key), value, dg.Message)
		return &c
	}
	return diag.New(diag.InvalidValue, subject, "environment %s = %q: %v", EnvName(key), value, err)
}

func integer(p *int, min, max int64) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) { *p = int(d.Integer(n, subject, min, max)) },
		fromEnv: func(s string) error {
			var v int
			if _, err := fmt.Sscan(s, &v); err != nil || int64(v) < min || int64(v) > max {
				return fmt.Errorf("want an integer between %d and %d", min, max)
			}
			*p = v
			return nil
		},
	}
}

// count reads an integer and checks it with check, which says why a value
// is refused (integer's fixed range gives a terser message).
func count(p *int, check func(int) error) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) {
			bad := len(d.Diags)
			v := d.Integer(n, subject, math.MinInt32, math.MaxInt32)
			if len(d.Diags) > bad {
				return
			}
			if err := check(int(v)); err != nil {
				d.Diags = append(d.Diags, refusal(err, d.File, n, subject, n.Value, nil))
				return
			}
			*p = int(v)
		},
		fromEnv: func(s string) error {
			v, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("want an integer")
			}
			if err := check(v); err != nil {
				return err
			}
			*p = v
			return nil
		},
	}
}

func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("want a positive duration such as 30s or 2m")
	}
	return v, nil
}

func duration(p *time.Duration) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) {
			s := d.Str(n, subject)
			if s == "" {
				return
			}
			v, err := parseDuration(s)
			if err != nil {
				d.Errorf(n, diag.InvalidValue, subject, err.Error(), "%s = %q is not a duration", subject, s)
				return
			}
			*p = v
		},
		fromEnv: func(s string) error {
			v, err := parseDuration(s)
			if err == nil {
				*p = v
			}
			return err
		},
	}
}

func boolean(p *bool) parser {
	return parser{
		set: func(d *yamlpos.Decoder, n *yaml.Node, subject string) { *p = d.Bool(n, subject) },
		fromEnv: func(s string) error {
			switch strings.ToLower(s) {
			case "true", "1", "yes":
				*p = true
			case "false", "0", "no":
				*p = false
			default:
				return fmt.Errorf("want true or false")
			}
			return nil
		},
	}
}

// section is a nested mapping of fields ("policy:"). Its leaves take
// environment overrides under their dotted path (SCELLIS_POLICY_MIN_COHORT).
func section(fields ...field) parser { return parser{sub: fields} }

// sections is a list of mappings, each naming itself with a "name" key, or
// a mapping from names to mappings; both give entries of one shape, made by
// item for each name. Names must be distinct. The leaves of an entry take
// environment overrides under KEY.NAME.… (SCELLIS_DATASETS_CARDIO_LABEL);
// entries themselves come from the file only.
func sections(what string, item func(name string) []field) parser {
	return parser{item: item, what: what}
}

func mk(key string, required bool, help string, p parser) field {
	return field{key: key, required: required, help: help, parser: p}
}

// load reads file into fields: YAML first, then environment overrides. It
// returns the positions of the values it read (see loaded.node).
func load(file, subject string, fields []field) (*loaded, error) {
	data, err := safefile.ReadFile(file, safefile.MaxConfig)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, diag.New(diag.InvalidValue, subject, "%s is larger than %s, the limit for config files", file, safefile.Size(safefile.MaxConfig)).
			WithHelp("a config names files (datasets, keys, the federation); it does not hold data")
	}
	if err != nil {
		return nil, diag.New(diag.FileUnreadable, subject, "cannot read %s: %v", file, unwrap(err)).
			WithHelp("check the path of the config file")
	}
	doc, err := yamlpos.Parse(file, data, subject)
	if err != nil {
		return nil, err
	}
	v := viper.New()
	v.SetEnvPrefix("SCELLIS")
	v.SetEnvKeyReplacer(envReplacer)
	l := &loaded{d: &yamlpos.Decoder{File: file}, v: v, nodes: map[string]*yaml.Node{}, env: map[string]string{}}
	l.section(doc, "", subject, fields, true)
	l.identityConflict(file, subject)
	return l, l.d.Err()
}

var envReplacer = strings.NewReplacer(".", "_", "-", "_")

// EnvName returns the environment variable that overrides a config key
// given by its dotted path: "policy.min_cohort" → SCELLIS_POLICY_MIN_COHORT.
func EnvName(path string) string { return "SCELLIS_" + strings.ToUpper(envReplacer.Replace(path)) }

// loaded is one decoding pass over a config file.
type loaded struct {
	d     *yamlpos.Decoder
	v     *viper.Viper
	nodes map[string]*yaml.Node // dotted path → the YAML value given for it
	env   map[string]string     // dotted path → variable that set it
}

// node returns where the value of path was given: its YAML node, or nil
// when it came from the environment or a default.
func (l *loaded) node(path string) *yaml.Node {
	if _, ok := l.env[path]; ok {
		return nil
	}
	return l.nodes[path]
}

// errorf records a diagnostic about the value of path: at its YAML node, or
// naming the environment variable that set it, or at the file.
func (l *loaded) errorf(path string, code diag.Code, subject, help, format string, args ...any) *diag.Diagnostic {
	if n := l.node(path); n != nil {
		return l.d.Errorf(n, code, subject, help, format, args...)
	}
	if name, ok := l.env[path]; ok {
		format += " (from " + name + ")"
	}
	return l.d.Errorf(nil, code, subject, help, format, args...)
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// section decodes the mapping n (nil when absent) into fields. path is the
// mapping's dotted path ("" at the top), subject names it in messages; top
// is true for the document itself, whose missing keys are reported at 1:1.
func (l *loaded) section(n *yaml.Node, path, subject string, fields []field, top bool) {
	known := make([]string, len(fields))
	for i, f := range fields {
		known[i] = f.key
	}
	var nodes map[string]*yaml.Node
	if n != nil {
		nodes = l.d.Fields(n, subject, known...)
	}
	for _, f := range fields {
		key := join(path, f.key)
		fn, given := nodes[f.key]
		if given {
			l.nodes[key] = fn
		}
		envSet := false
		switch {
		case f.sub != nil:
			l.section(fn, key, key, f.sub, false)
		case f.item != nil:
			if given {
				l.items(fn, key, f)
			}
		default:
			if given {
				f.set(l.d, fn, key)
			}
			_ = l.v.BindEnv(key)
			if s := l.v.GetString(key); s != "" {
				envSet = true
				l.env[key] = EnvName(key)
				if err := f.fromEnv(s); err != nil {
					l.d.Diags = append(l.d.Diags, envRefusal(err, subject, key, s))
				}
			}
		}
		if !f.required || given || envSet || (!top && (n == nil || n.Kind != yaml.MappingNode)) {
			// An absent or malformed section is reported once, not per key.
			continue
		}
		var dg *diag.Diagnostic
		if top || n == nil {
			dg = diag.New(diag.MissingField, subject, "required key %q is missing", f.key).At(l.d.File, 1, 1)
			l.d.Diags = append(l.d.Diags, dg)
		} else {
			dg = l.d.Errorf(n, diag.MissingField, subject, "", "required key %q is missing", f.key)
		}
		if f.help != "" {
			dg.WithHelp("%s", f.help)
		}
	}
}

// items decodes a list or mapping of named sections (see sections).
func (l *loaded) items(n *yaml.Node, path string, f field) {
	seen := map[string]*yaml.Node{}
	entry := func(name string, at, body *yaml.Node, listForm bool, index int) {
		key := fmt.Sprintf("%s[%d]", path, index)
		subject := fmt.Sprintf("%s %d", f.what, index+1)
		if name != "" {
			key, subject = join(path, name), f.what+" "+strconv.Quote(name)
			if first, dup := seen[name]; dup {
				l.d.Errorf(at, diag.ConfigDuplicate, subject,
					fmt.Sprintf("it is first given on line %d; give each %s its own name", first.Line, f.what),
					"%s name %q given twice", f.what, name)
				return
			}
			seen[name] = at
		}
		l.nodes[key] = at
		fields := f.item(name)
		if listForm {
			var ignored string
			fields = append([]field{mk("name", true, "name the "+f.what, str(&ignored))}, fields...)
		}
		l.section(body, key, subject, fields, false)
	}
	switch n.Kind {
	case yaml.SequenceNode:
		for i, it := range n.Content {
			name, at := "", it
			if it.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(it.Content); j += 2 {
					if k, v := it.Content[j], it.Content[j+1]; k.Value == "name" && v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
						name, at = v.Value, v
					}
				}
			}
			entry(name, at, it, true, i)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Value == "" {
				l.d.Errorf(k, diag.WrongType, path, "", "%s names must be strings", f.what)
				continue
			}
			entry(k.Value, k, v, false, i/2)
		}
	default:
		l.d.Errorf(n, diag.WrongType, path, fmt.Sprintf("write one %s per list item (\"- name: …\"), or map names to %ss", f.what, f.what),
			"%s must be a list or a mapping, not %s", path, yamlpos.KindName(n))
	}
}

func unwrap(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// resolve makes a path relative to the config file's folder absolute.
func resolve(file, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(file), p)
}

// identityConflict refuses SCELLIS_IDENTITY or SCELLIS_FEDERATION naming
// another file than the config's identity or federation: those variables
// are also the CLI's (federation init tells every user to export them), so
// one left in an operator's shell would otherwise silently start an
// appliance as someone else, or against another federation. The same
// file, or the variable with no such key in the file, is fine.
func (l *loaded) identityConflict(file, subject string) {
	for _, key := range []string{"identity", "federation"} {
		n, inFile := l.nodes[key]
		name, fromEnv := l.env[key]
		if !inFile || !fromEnv || n.Kind != yaml.ScalarNode {
			continue
		}
		env := os.Getenv(name)
		abs, err := filepath.Abs(env)
		cfg, err2 := filepath.Abs(resolve(file, n.Value))
		if err == nil && err2 == nil && abs == cfg {
			continue
		}
		what := "key"
		if key == "federation" {
			what = "federation file"
		}
		l.d.Errorf(n, diag.InvalidValue, subject,
			fmt.Sprintf("unset %s to start with the config's %s (it is meant for CLI commands), or remove %s from the config to take the variable's", name, what, key),
			"%s=%s conflicts with %s: %s in the config", name, env, key, n.Value)
	}
}

// Positions maps a config's top-level keys to where its file gives them,
// so checks made after loading (start-up and config check) can point there.
type Positions map[string]diag.Position

// At positions d at key of file, or at the file when the key is not in it.
func (p Positions) At(d *diag.Diagnostic, file, key string) *diag.Diagnostic {
	if pos, ok := p[key]; ok {
		return d.At(pos.File, pos.Line, pos.Col)
	}
	return d.At(file, 1, 1)
}

func (l *loaded) positions() Positions {
	p := Positions{}
	for k, n := range l.nodes {
		if !strings.Contains(k, ".") && !strings.Contains(k, "[") {
			p[k] = diag.Position{File: l.d.File, Line: n.Line, Col: n.Column}
		}
	}
	// A value an environment variable set is reported there, naming what
	// it overrode: a start-up refusal must not point at a line of the file
	// whose value was not the one used.
	for k, name := range l.env {
		if strings.Contains(k, ".") || strings.Contains(k, "[") {
			continue
		}
		pos := diag.Position{File: "$" + name}
		if n, ok := l.nodes[k]; ok {
			pos.File += fmt.Sprintf(" (overriding %s:%d:%d)", l.d.File, n.Line, n.Column)
		}
		p[k] = pos
	}
	return p
}
