package job

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
)

// decoder walks a yaml.Node tree and collects every problem with its
// file:line:col, so a user sees all of them at once (nats processConfigErr).
type decoder struct {
	file  string
	diags diag.List
}

func (d *decoder) errorf(n *yaml.Node, code diag.Code, subject, help, format string, args ...any) {
	dg := diag.New(code, subject, format, args...)
	if n != nil {
		dg.At(d.file, n.Line, n.Column)
	} else {
		dg.Pos = &diag.Position{File: d.file}
	}
	if help != "" {
		dg.WithHelp("%s", help)
	}
	d.diags = append(d.diags, dg)
}

// fields checks a mapping's keys against known and returns key → value
// nodes, reporting unknown and duplicate keys.
func (d *decoder) fields(n *yaml.Node, subject string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, diag.WrongType, subject, "", "%s must be a mapping of keys to values, not %s", subject, kindName(n))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !contains(known, k.Value) {
			help := "known keys are: " + strings.Join(known, ", ")
			if s := suggest(k.Value, known); s != "" {
				help = fmt.Sprintf("did you mean %q? ", s) + help
			}
			d.errorf(k, diag.UnknownKey, subject, help, "unknown key %q", k.Value)
			continue
		}
		if _, dup := out[k.Value]; dup {
			d.errorf(k, diag.ConfigDuplicate, subject, "remove one of them", "key %q given twice", k.Value)
			continue
		}
		out[k.Value] = v
	}
	return out
}

func (d *decoder) str(n *yaml.Node, subject string) string {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		d.errorf(n, diag.WrongType, subject, "quote it if it is meant as text", "%s must be a string, not %s", subject, kindName(n))
		return ""
	}
	return n.Value
}

func (d *decoder) boolean(n *yaml.Node, subject string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		d.errorf(n, diag.WrongType, subject, "use true or false", "%s must be true or false, not %s", subject, kindName(n))
		return false
	}
	b, _ := strconv.ParseBool(n.Value)
	return b
}

func (d *decoder) integer(n *yaml.Node, subject string, min, max int64) int64 {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.errorf(n, diag.WrongType, subject, "", "%s must be an integer, not %s", subject, kindName(n))
		return 0
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < min || v > max {
		d.errorf(n, diag.InvalidValue, subject, fmt.Sprintf("give an integer between %d and %d", min, max), "%s = %s is out of range", subject, n.Value)
		return 0
	}
	return v
}

func (d *decoder) number(n *yaml.Node, subject string, min, max float64) float64 {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		d.errorf(n, diag.WrongType, subject, "", "%s must be a number, not %s", subject, kindName(n))
		return 0
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || v < min || v > max {
		d.errorf(n, diag.InvalidValue, subject, fmt.Sprintf("give a number between %g and %g", min, max), "%s = %s is out of range", subject, n.Value)
		return 0
	}
	return v
}

// value converts any YAML value into the plain Go values content sees:
// nil, bool, int64, float64, string, []any, map[string]any.
func (d *decoder) value(n *yaml.Node, subject string) any {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return d.value(n.Content[0], subject)
	case yaml.AliasNode:
		return d.value(n.Alias, subject)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			out = append(out, d.value(c, fmt.Sprintf("%s[%d]", subject, i)))
		}
		return out
	case yaml.MappingNode:
		out := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				d.errorf(k, diag.WrongType, subject, "", "keys in %s must be strings", subject)
				continue
			}
			if _, dup := out[k.Value]; dup {
				d.errorf(k, diag.ConfigDuplicate, subject, "remove one of them", "key %q given twice", k.Value)
				continue
			}
			out[k.Value] = d.value(v, subject+"."+k.Value)
		}
		return out
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil
		case "!!bool":
			b, _ := strconv.ParseBool(n.Value)
			return b
		case "!!int":
			var v int64
			if err := n.Decode(&v); err != nil {
				d.errorf(n, diag.InvalidValue, subject, "integers must fit in 64 bits", "%s = %s is out of range", subject, n.Value)
			}
			return v
		case "!!float":
			var v float64
			if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				d.errorf(n, diag.InvalidValue, subject, "parameters must be finite numbers", "%s = %s is not a finite number", subject, n.Value)
			}
			return v
		case "!!str":
			return n.Value
		default:
			d.errorf(n, diag.WrongType, subject, "", "%s has unsupported type %s", subject, n.Tag)
			return nil
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!null":
			return "null"
		default:
			return fmt.Sprintf("%s %s", strings.TrimPrefix(n.Tag, "!!"), n.Value)
		}
	}
	return "an alias"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns the known key closest to s when it is a likely typo.
func suggest(s string, known []string) string {
	best, bestD := "", 3
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	for _, k := range sorted {
		if dd := editDistance(s, k); dd < bestD || (strings.HasPrefix(k, s) && len(s) >= 3 && bestD > 1) {
			best, bestD = k, min(dd, 1)
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
