package main

import (
	"bytes"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
)

// plannedRunFile returns the run file src with a plan's settings: the
// privacy section's sigma (and q, steps at record level; none at silo
// level), sums_sigma and
// eval_sigma, and at record level the strategy's params.steps (one
// model.train of the planned DP-SGD steps per round; params.epochs goes).
// Everything else, comments included, is kept.
func plannedRunFile(src []byte, c planChoice, unit fl.Unit) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, diag.New(diag.YAMLSyntax, "run", "the run file is not a YAML mapping: %v", err)
	}
	root := doc.Content[0]
	priv := mappingAt(root, "privacy")
	if lookup(priv, "clip") == nil {
		setScalar(priv, "clip", num(c.spec.Clip))
	}
	setScalar(priv, "sigma", num(c.Sigma))
	if unit == fl.UnitSilo {
		// A round releases the whole update: no sampling rate, no steps.
		remove(priv, "q")
		remove(priv, "steps")
	} else {
		setScalar(priv, "q", num(c.Q))
		setScalar(priv, "steps", strconv.Itoa(c.Steps))
		strat := lookup(root, "strategy")
		if strat != nil && strat.Kind == yaml.ScalarNode {
			use := *strat
			*strat = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle}
			setScalar(strat, "use", use.Value)
		}
		if strat != nil {
			params := mappingAt(strat, "params")
			remove(params, "epochs")
			setScalar(params, "steps", strconv.Itoa(c.Steps))
		}
	}
	if c.SumsSigma > 0 {
		setScalar(priv, "sums_sigma", num(c.SumsSigma))
	}
	if c.EvalSigma > 0 {
		setScalar(priv, "eval_sigma", num(c.EvalSigma))
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return b.Bytes(), enc.Close()
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// lookup returns the value of key in mapping m, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// mappingAt returns the mapping under key in m, added (flow style) when
// missing.
func mappingAt(m *yaml.Node, key string) *yaml.Node {
	if v := lookup(m, key); v != nil && v.Kind == yaml.MappingNode {
		return v
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle}
	if old := lookup(m, key); old != nil {
		*old = *v
		return old
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v
}

// setScalar sets key in mapping m to the plain scalar value (its tag
// resolved as YAML would: a number stays a number).
func setScalar(m *yaml.Node, key, value string) {
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: value}
	if v := lookup(m, key); v != nil {
		n.LineComment = v.LineComment
		*v = *n
		return
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, n)
}

// remove deletes key from mapping m.
func remove(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}
