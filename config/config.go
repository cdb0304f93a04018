// Package config loads the appliances' config files (aggregator, worker,
// later silo) into typed structs: YAML with positions, environment
// overrides through viper (SCELLIS_<KEY>, dots as underscores), unknown keys
// rejected, and every problem reported at once as diagnostics with
// file:line:col. Relative paths resolve against the config file's folder.
package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/viper"
	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/yamlpos"
)

// field describes one config key: its name, where it goes, how to parse it.
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
}

func str(p *string) parser {
	return parser{
		set:     func(d *yamlpos.Decoder, n *yaml.Node, subject string) { *p = d.Str(n, subject) },
		fromEnv: func(s string) error { *p = s; return nil },
	}
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

func mk(key string, required bool, help string, p parser) field {
	return field{key: key, required: required, help: help, parser: p}
}

// load reads file into fields: YAML first, then environment overrides.
func load(file, subject string, fields []field) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return diag.New(diag.FileUnreadable, subject, "cannot read %s: %v", file, unwrap(err)).
			WithHelp("check the path of the config file")
	}
	doc, err := yamlpos.Parse(file, data, subject)
	if err != nil {
		return err
	}
	d := &yamlpos.Decoder{File: file}
	known := make([]string, len(fields))
	for i, f := range fields {
		known[i] = f.key
	}
	v := viper.New()
	v.SetEnvPrefix("SCELLIS")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	var nodes map[string]*yaml.Node
	if doc != nil {
		nodes = d.Fields(doc, subject, known...)
	}
	for _, f := range fields {
		if n, ok := nodes[f.key]; ok {
			f.set(d, n, f.key)
		}
		_ = v.BindEnv(f.key)
		envSet := false
		if s := v.GetString(f.key); s != "" {
			envSet = true
			if err := f.fromEnv(s); err != nil {
				d.Diags = append(d.Diags, diag.New(diag.InvalidValue, subject,
					"environment SCELLIS_%s = %q: %v", strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(f.key)), s, err))
			}
		}
		if f.required && nodes[f.key] == nil && !envSet {
			dg := diag.New(diag.MissingField, subject, "required key %q is missing", f.key).At(file, 1, 1)
			if f.help != "" {
				dg.WithHelp("%s", f.help)
			}
			d.Diags = append(d.Diags, dg)
		}
	}
	return d.Err()
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
