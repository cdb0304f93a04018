// Package yamlpos decodes YAML config files through yaml.Node trees so that
// every problem is reported at once, each as a diag.Diagnostic at its
// file:line:col (nats processConfigErr). Its invariant: a Decoder never stops
// at the first problem and never drops one — callers read what they can,
// keep going, and return Err at the end.
//
// It only knows the generic config codes (SC1001–SC1007); callers add their
// own codes with Errorf.
package yamlpos

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
)

// Parse reads one YAML document. It returns the document's top node, or nil
// when the file holds no document (empty or only comments). A syntax error,
// or a second document after "---", is an SC1001 diagnostic whose subject is
// subject.
func Parse(file string, data []byte, subject string) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntax(file, subject, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		line := extra.Line
		if len(extra.Content) > 0 {
			line = extra.Content[0].Line
		}
		return nil, diag.New(diag.YAMLSyntax, subject, "the file holds more than one YAML document").
			At(file, line, 0).WithHelp("keep one document; remove the second \"---\" and what follows")
	} else if !errors.Is(err, io.EOF) {
		return nil, syntax(file, subject, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	if a := aliasGrowth(doc.Content[0]); a.n > a.limit {
		return nil, diag.New(diag.YAMLAliasBomb, subject, "aliases expand the document past %d nodes", a.limit).
			At(file, a.where.Line, a.where.Column).
			WithHelp("write the values out, or use fewer, smaller anchors (*alias); each alias counts as a copy of what it names")
	}
	return doc.Content[0], nil
}

// MaxAliasNodes is how many nodes aliases may add to a document when it is
// expanded (a document larger than that may add as many nodes as it has).
// A "billion laughs" file of a few hundred bytes nests aliases of aliases
// so that expanding them, which Value does, would build billions of nodes.
const MaxAliasNodes = 100_000

type growth struct {
	n, limit int64
	where    *yaml.Node // the alias at which the budget ran out
}

// aliasGrowth counts the nodes aliases add to the expanded document, in
// time linear in the literal document (sizes of anchored subtrees are
// memoised) and saturating, so the count itself cannot overflow.
func aliasGrowth(root *yaml.Node) growth {
	memo := map[*yaml.Node]int64{}
	const sat = math.MaxInt64 / 4
	var size func(n *yaml.Node) int64
	literal := int64(0)
	size = func(n *yaml.Node) int64 {
		if v, ok := memo[n]; ok {
			return v
		}
		memo[n] = sat // a node that contains itself expands without end
		total := int64(1)
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			total = size(n.Alias)
		} else {
			for _, c := range n.Content {
				total += size(c)
				if total > sat {
					total = sat
				}
			}
		}
		memo[n] = total
		return total
	}
	var walk func(n *yaml.Node, g *growth)
	walk = func(n *yaml.Node, g *growth) {
		literal++
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			g.n += size(n.Alias)
			if g.n > sat {
				g.n = sat
			}
			if g.where == nil && g.n > MaxAliasNodes {
				g.where = n
			}
			return
		}
		for _, c := range n.Content {
			walk(c, g)
		}
	}
	g := growth{}
	walk(root, &g)
	g.limit = MaxAliasNodes
	if literal > g.limit {
		g.limit = literal
	}
	if g.where == nil {
		g.where = root
	}
	return g
}

func syntax(file, subject string, err error) *diag.Diagnostic {
	// yaml.v3 reports "yaml: line N: message"; keep the line for the caret.
	msg := err.Error()
	line := 0
	if _, e := fmt.Sscanf(msg, "yaml: line %d:", &line); e == nil {
		if i := len(fmt.Sprintf("yaml: line %d: ", line)); i <= len(msg) {
			msg = msg[i:]
		}
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	dg := diag.New(diag.YAMLSyntax, subject, "%s", msg).WithHelp("fix the YAML syntax (indentation, colons, quotes)")
	if line > 0 {
		dg.At(file, line, 0)
	} else {
		dg.Pos = &diag.Position{File: file}
	}
	return dg
}

// Decoder walks a yaml.Node tree of one file and collects diagnostics.
// The zero value with File set is ready to use.
type Decoder struct {
	File  string
	Diags diag.List
}

// Errorf records an error-severity diagnostic at n (or at the file when n is
// nil) and returns it, so the caller can adjust it.
func (d *Decoder) Errorf(n *yaml.Node, code diag.Code, subject, help, format string, args ...any) *diag.Diagnostic {
	dg := diag.New(code, subject, format, args...)
	if n != nil {
		dg.At(d.File, n.Line, n.Column)
	} else {
		dg.Pos = &diag.Position{File: d.File}
	}
	if help != "" {
		dg.WithHelp("%s", help)
	}
	d.Diags = append(d.Diags, dg)
	return dg
}

// Err returns the diagnostics, ordered by position, as an error when at
// least one is an error; otherwise nil.
func (d *Decoder) Err() error {
	sort.SliceStable(d.Diags, func(i, j int) bool {
		a, b := d.Diags[i].Pos, d.Diags[j].Pos
		if a == nil || b == nil {
			return a == nil && b != nil
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	return d.Diags.Err()
}

// Fields checks a mapping's keys against known and returns key → value
// nodes, reporting unknown keys (SC1002), duplicate keys (SC1007) and a
// value that is not a mapping (SC1003).
func (d *Decoder) Fields(n *yaml.Node, subject string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		d.Errorf(n, diag.WrongType, subject, "", "%s must be a mapping of keys to values, not %s", subject, KindName(n))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !contains(known, k.Value) {
			help := "known keys are: " + strings.Join(known, ", ")
			if s := Suggest(k.Value, known); s != "" {
				help = fmt.Sprintf("did you mean %q? ", s) + help
			}
			d.Errorf(k, diag.UnknownKey, subject, help, "unknown key %q", k.Value)
			continue
		}
		if first, dup := out[k.Value]; dup {
			d.Errorf(k, diag.ConfigDuplicate, subject, fmt.Sprintf("it is first given on line %d; keep one", first.Line), "key %q given twice", k.Value)
			continue
		}
		out[k.Value] = v
	}
	return out
}

// Required returns f[key], reporting SC1004 at parent when it is missing.
// parent is the mapping f came from.
func (d *Decoder) Required(parent *yaml.Node, f map[string]*yaml.Node, key, subject string) *yaml.Node {
	n, ok := f[key]
	if !ok && parent.Kind == yaml.MappingNode {
		d.Errorf(parent, diag.MissingField, subject, fmt.Sprintf("add a %q key", key), "required key %q is missing", key)
	}
	return n
}

// Seq returns the items of a list, reporting SC1003 when n is not one.
func (d *Decoder) Seq(n *yaml.Node, subject string) []*yaml.Node {
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n, diag.WrongType, subject, "write one item per line, each starting with \"- \"", "%s must be a list, not %s", subject, KindName(n))
		return nil
	}
	return n.Content
}

// Str returns a string scalar, reporting SC1003 for anything else.
func (d *Decoder) Str(n *yaml.Node, subject string) string {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		d.Errorf(n, diag.WrongType, subject, "quote it if it is meant as text", "%s must be a string, not %s", subject, KindName(n))
		return ""
	}
	return n.Value
}

// Bool returns a boolean scalar, reporting SC1003 for anything else.
func (d *Decoder) Bool(n *yaml.Node, subject string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		d.Errorf(n, diag.WrongType, subject, "use true or false", "%s must be true or false, not %s", subject, KindName(n))
		return false
	}
	b, _ := strconv.ParseBool(n.Value)
	return b
}

// Integer returns an integer scalar in [min, max], reporting SC1003 for a
// non-integer and SC1005 for one out of range.
func (d *Decoder) Integer(n *yaml.Node, subject string, min, max int64) int64 {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.Errorf(n, diag.WrongType, subject, "", "%s must be an integer, not %s", subject, KindName(n))
		return 0
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < min || v > max {
		d.Errorf(n, diag.InvalidValue, subject, fmt.Sprintf("give an integer between %d and %d", min, max), "%s = %s is out of range", subject, n.Value)
		return 0
	}
	return v
}

// Number returns a finite number in [min, max], reporting SC1003 for a
// non-number and SC1005 for one out of range.
func (d *Decoder) Number(n *yaml.Node, subject string, min, max float64) float64 {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		d.Errorf(n, diag.WrongType, subject, "", "%s must be a number, not %s", subject, KindName(n))
		return 0
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || v < min || v > max {
		d.Errorf(n, diag.InvalidValue, subject, fmt.Sprintf("give a number between %g and %g", min, max), "%s = %s is out of range", subject, n.Value)
		return 0
	}
	return v
}

// Value converts any YAML value into plain Go values: nil, bool, int64,
// float64, string, []any, map[string]any.
func (d *Decoder) Value(n *yaml.Node, subject string) any {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return d.Value(n.Content[0], subject)
	case yaml.AliasNode:
		return d.Value(n.Alias, subject)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			out = append(out, d.Value(c, fmt.Sprintf("%s[%d]", subject, i)))
		}
		return out
	case yaml.MappingNode:
		out := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				d.Errorf(k, diag.WrongType, subject, "", "keys in %s must be strings", subject)
				continue
			}
			if _, dup := out[k.Value]; dup {
				d.Errorf(k, diag.ConfigDuplicate, subject, "remove one of them", "key %q given twice", k.Value)
				continue
			}
			out[k.Value] = d.Value(v, subject+"."+k.Value)
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
				d.Errorf(n, diag.InvalidValue, subject, "integers must fit in 64 bits", "%s = %s is out of range", subject, n.Value)
			}
			return v
		case "!!float":
			var v float64
			if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				d.Errorf(n, diag.InvalidValue, subject, "parameters must be finite numbers", "%s = %s is not a finite number", subject, n.Value)
			}
			return v
		case "!!str":
			return n.Value
		default:
			d.Errorf(n, diag.WrongType, subject, "", "%s has unsupported type %s", subject, n.Tag)
			return nil
		}
	}
	return nil
}

// KindName describes a node for a message: "a mapping", "the string \"x\"".
func KindName(n *yaml.Node) string {
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

// Suggest returns the known word closest to s when s is a likely typo of it,
// or "" (see diag.Suggest).
func Suggest(s string, known []string) string { return diag.Suggest(s, known) }
