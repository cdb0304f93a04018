package main

import (
	"fmt"
	"strconv"
	"strings"
)

// siloConfig is a test silo's config file: what every test silo has (its
// name, key, the federation file, data_dir under its own folder) and what
// a test chooses. One writer, so a new config key or a changed default
// is changed once.
type siloConfig struct {
	name string
	// header: more top-level lines (poll, parent_federation, log_format,
	// metrics_listen…), each ending in a newline.
	header   string
	datasets []siloDataset
	// policy: the lines under policy:, each indented two spaces and
	// ending in a newline; none writes no policy.
	policy string
}

// siloDataset is one dataset entry; the label is outcome unless set.
type siloDataset struct {
	name, path, label string
	epsilon           float64 // the budget, at δ = 1e-5
	unit              string  // "silo" or "" (record level, the default)
	extra             string  // more entries of the flow map, e.g. "public_rows: true"
}

// hospitalSilo is silo name with data/hospital-<site>.csv as its dataset
// patients (datagen hospitals), budget ε at δ = 1e-5, protected at unit
// ("" record level, or "silo").
func hospitalSilo(name string, site int, epsilon float64, unit string) siloConfig {
	return siloConfig{name: name, datasets: []siloDataset{{name: "patients", path: fmt.Sprintf("data/hospital-%d.csv", site), epsilon: epsilon, unit: unit}}}
}

func (s siloConfig) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nidentity: %s/identity.key\nfederation: federation.yaml\ndata_dir: %s/data\n%sdatasets:\n", s.name, s.name, s.name, s.header)
	for _, d := range s.datasets {
		label := d.label
		if label == "" {
			label = "outcome"
		}
		fmt.Fprintf(&b, "  - {name: %s, path: %s, label: %s, class: confidential, budget: {epsilon: %s, delta: 1.0e-5}", d.name, d.path, label, strconv.FormatFloat(d.epsilon, 'f', -1, 64))
		if d.unit != "" {
			fmt.Fprintf(&b, ", unit: %s", d.unit)
		}
		if d.extra != "" {
			fmt.Fprintf(&b, ", %s", d.extra)
		}
		b.WriteString("}\n")
	}
	if s.policy != "" {
		b.WriteString("policy:\n" + s.policy)
	}
	return b.String()
}

// writeSilo writes s as <name>.yaml in the cluster's folder.
func (c *cluster) writeSilo(s siloConfig) { c.write(s.name+".yaml", s.String()) }
