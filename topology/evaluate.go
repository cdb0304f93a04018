package topology

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/script"
)

// Default is the topology a pool runs when none is named: one cluster
// leading every member. It is reached through the catalog like any other.
const Default = "flat"

// Resolve finds a topology in c — a name, a sha256: ref, or a path to a
// .star file (relative paths resolve against baseDir) — exactly as a job's
// content is resolved, and checks that it is a topology whose load()s the
// catalog can satisfy. Another kind is diag.ContentKind.
func Resolve(c *catalog.Catalog, ref, baseDir string) (*catalog.Entry, error) {
	e, err := c.Resolve(ref, baseDir)
	if err != nil {
		return nil, err
	}
	if e.Kind != catalog.Topology {
		return nil, diag.New(diag.ContentKind, e.Subject(), "%s is a %s, not a topology", e.Name, e.Kind).
			At(e.Path, 0, 0).
			WithHelp("a topology defines topology(members, params); scellis catalog ls shows each entry's kind")
	}
	if _, err := c.Closure(e); err != nil {
		return nil, err
	}
	return e, nil
}

// Evaluate runs e's topology(members, params) in the sandbox (default
// limits, load() from c) and validates what it returns into a Plan.
//
// Content receives members as a list of dicts {"name", "role", "region",
// "capacity"} (region and capacity None when the federation file gives
// none) and params as a dict. It returns
//
//	{"clusters": [{"name": str, "parent": str or None,
//	               "nodes": [aggregator names], "leads": [silo and worker names]}, ...],
//	 "fanout": int (optional: the most members plus child clusters a cluster may lead)}
//
// A value of the wrong shape is diag.ContentShape; a plan that is not a
// tree placing every member once, or breaks its fan-out, is
// diag.TopologyInvalid; a sub-cohort of one or two silos is
// diag.RunTooFewSites — all positioned at the topology function and
// reported together. Errors inside the content are the sandbox's
// diagnostics (a fail() is diag.StarlarkRuntime at its line).
func Evaluate(ctx context.Context, c *catalog.Catalog, e *catalog.Entry, members []Member, params map[string]any) (*Plan, error) {
	if e.Kind != catalog.Topology {
		return nil, diag.New(diag.ContentKind, e.Subject(), "%s is a %s, not a topology", e.Name, e.Kind).At(e.Path, 0, 0)
	}
	if params == nil {
		params = map[string]any{}
	}
	arg := make([]any, len(members))
	seen := make(map[string]bool, len(members))
	for i, m := range members {
		if seen[m.Name] {
			return nil, fmt.Errorf("topology: member %q given twice", m.Name) // the federation parser refuses this: a bug
		}
		seen[m.Name] = true
		d := map[string]any{"name": m.Name, "role": string(m.Role), "region": nil, "capacity": nil}
		if m.Region != "" {
			d["region"] = m.Region
		}
		if m.Capacity != 0 {
			d["capacity"] = m.Capacity
		}
		arg[i] = d
	}
	out, err := script.Call(ctx, script.Env{Catalog: c}, e, "topology", arg, params)
	if err != nil {
		// The sandbox's help speaks of a job's limits; a topology has
		// none to raise.
		if ds, ok := diag.As(err); ok {
			for _, d := range ds {
				if d.Code == diag.MemoryBudget || d.Code == diag.StepBudget {
					d.WithHelp("a topology runs under the sandbox's default budgets (%d MiB, %d steps), which nothing raises: make it do less per member, or lay out fewer members (%d here)",
						script.DefaultMemoryBytes>>20, script.DefaultSteps, len(members))
				}
			}
		}
		return nil, err
	}
	line := defLine(e, "topology")
	var diags diag.List
	problem := func(code diag.Code, format string, args ...any) {
		diags = append(diags, diag.New(code, e.Subject(), "topology returned a plan where "+format, args...).
			At(e.Path, line, 1).WithSource(e.SourceLine(line)).
			WithHelp("scellis topology plan --federation FILE --topology %s prints what it returns; docs/topology.md gives the rules", e.Name))
	}
	raw, fanout := decode(out, func(format string, args ...any) {
		diags = append(diags, diag.New(diag.ContentShape, e.Subject(), "topology returned "+format, args...).
			At(e.Path, line, 1).WithSource(e.SourceLine(line)).
			WithHelp(`return {"clusters": [{"name": ..., "parent": None or a name, "nodes": [...], "leads": [...]}], "fanout": int}`))
	})
	if err := diags.Err(); err != nil {
		return nil, err
	}
	p := build(members, raw, fanout, problem)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	p.Topology, p.Ref, p.Params = e.Name, e.Ref, maps.Clone(params)
	return p, nil
}

// decode checks the shape of what topology() returned, strictly: unknown
// keys are refused so that a misspelt "fanuot" is not silently no limit.
func decode(out any, bad func(format string, args ...any)) ([]Cluster, int) {
	top, ok := out.(map[string]any)
	if !ok {
		bad("%s, not a dict", script.Describe(out))
		return nil, 0
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if k != "clusters" && k != "fanout" {
			bad("an unknown key %q (the keys are clusters and fanout)", k)
		}
	}
	fanout := 0
	if v, ok := top["fanout"]; ok && v != nil {
		n, ok := v.(int64)
		if !ok || n < 1 || n > 1<<30 {
			bad("fanout = %s; it must be an int from 1 to 2^30, or None for no limit", describe(v))
		} else {
			fanout = int(n)
		}
	}
	list, ok := top["clusters"].([]any)
	if !ok || len(list) == 0 {
		bad("no clusters: \"clusters\" must be a non-empty list of dicts")
		return nil, fanout
	}
	raw := make([]Cluster, 0, len(list))
	for i, item := range list {
		d, ok := item.(map[string]any)
		if !ok {
			bad("clusters[%d] = %s, not a dict", i, script.Describe(item))
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(d)) {
			switch k {
			case "name", "parent", "nodes", "leads":
			default:
				bad("an unknown key %q in clusters[%d] (the keys are name, parent, nodes and leads)", k, i)
			}
		}
		var c Cluster
		if c.Name, ok = d["name"].(string); !ok {
			bad("clusters[%d] without a string name", i)
			continue
		}
		if v := d["parent"]; v != nil {
			if c.Parent, ok = v.(string); !ok || c.Parent == "" {
				bad("cluster %q with parent %s: a parent is a cluster's name, or None for the root", c.Name, describe(v))
			}
		}
		c.Nodes = names(d["nodes"], fmt.Sprintf("cluster %q nodes", c.Name), bad)
		c.Leads = names(d["leads"], fmt.Sprintf("cluster %q leads", c.Name), bad)
		raw = append(raw, c)
	}
	return raw, fanout
}

// describe shows a value content returned where a name or an int was
// due: a string quoted (it may hold control characters), a float as one.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return shown(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64) + " (a float)"
	}
	return fmt.Sprint(v)
}

// names reads an optional list of strings.
func names(v any, what string, bad func(format string, args ...any)) []string {
	if v == nil {
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		bad("%s = %s, not a list of member names", what, script.Describe(v))
		return nil
	}
	out := make([]string, 0, len(list))
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			bad("%s holding %s, not a member name", what, script.Describe(x))
			continue
		}
		out = append(out, s)
	}
	return out
}

// defLine returns the line of "def fn(" in the entry's source, 0 if absent.
func defLine(e *catalog.Entry, fn string) int {
	for i, line := range strings.Split(string(e.Source), "\n") {
		if strings.HasPrefix(line, "def "+fn+"(") {
			return i + 1
		}
	}
	return 0
}
