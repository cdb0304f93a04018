package topology

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// Member is what a topology sees of one federation member. Only machines
// (aggregators, silos, workers, and child clusters listed as members with
// role cluster, docs/tree.md) are placed; people call the root cluster.
type Member struct {
	Name     string        `json:"name"`
	Role     identity.Role `json:"role"`
	Region   string        `json:"region,omitempty"`   // "" when the federation file gives none
	Capacity int64         `json:"capacity,omitempty"` // 0 when the federation file gives none
}

// Members returns the machines of fed's current membership — aggregators,
// then silos, workers and child clusters (role cluster), each in file
// order — with their region and capacity. A child cluster is led like a
// worker: it leases its parent's shards.
func Members(fed *identity.Federation) []Member {
	var out []Member
	for _, r := range []identity.Role{identity.Aggregator, identity.Silo, identity.Worker, identity.Cluster} {
		for _, m := range fed.ByRole(r) {
			out = append(out, Member{Name: m.Name, Role: m.Role, Region: m.Region, Capacity: m.Capacity})
		}
	}
	return out
}

// Cluster is one coordinator cluster of a Plan: a Raft group of its own.
type Cluster struct {
	Name string `json:"name"`
	// Parent is the cluster this one reports to; "" for the root.
	Parent string `json:"parent,omitempty"`
	// Depth is 0 for the root, 1 for its children, and so on.
	Depth int `json:"depth"`
	// Nodes are the aggregators replicating this cluster, in the
	// topology's order.
	Nodes []string `json:"nodes"`
	// Leads are the silos, workers and member clusters (role cluster)
	// this cluster leads directly: it leases their shards and runs their
	// rounds.
	Leads []string `json:"leads"`
	// SubCohort is the silos among Leads, in the same order: the sites
	// whose masked inputs this cluster sums into its partial sum.
	SubCohort []string `json:"sub_cohort"`
	// Children are the clusters reporting to this one, in the topology's
	// order; this cluster sums their partial sums with its own.
	Children []string `json:"children"`
}

// FanOut is how many direct correspondents the cluster's leader serves:
// the members it leads plus its child clusters.
func (c *Cluster) FanOut() int { return len(c.Leads) + len(c.Children) }

// Plan is a validated topology: a tree of coordinator clusters placing
// every machine member exactly once. A Plan is read-only once Evaluate
// returns it and safe for concurrent use.
type Plan struct {
	// Topology and Ref name the entry that produced the plan.
	Topology string         `json:"topology"`
	Ref      content.Ref    `json:"ref"`
	Params   map[string]any `json:"params"`
	// FanOut is the limit the topology declared (0: none); every cluster's
	// FanOut() is within it.
	FanOut int `json:"fanout,omitempty"`
	// Clusters lists the root first, then breadth-first, children in the
	// order the topology gave.
	Clusters []Cluster `json:"clusters"`

	byName   map[string]int // cluster name → index
	byMember map[string]int // member name → index of the cluster it belongs to
}

// Root returns the top cluster.
func (p *Plan) Root() *Cluster { return &p.Clusters[0] }

// Cluster returns the cluster named name.
func (p *Plan) Cluster(name string) (*Cluster, bool) {
	i, ok := p.byName[name]
	if !ok {
		return nil, false
	}
	return &p.Clusters[i], true
}

// ClusterOf returns the cluster a member belongs to: the one it is a node
// of (an aggregator) or the one leading it (a silo or worker).
func (p *Plan) ClusterOf(member string) (*Cluster, bool) {
	i, ok := p.byMember[member]
	if !ok {
		return nil, false
	}
	return &p.Clusters[i], true
}

// Children returns the names of the clusters reporting to name.
func (p *Plan) Children(name string) []string {
	if c, ok := p.Cluster(name); ok {
		return c.Children
	}
	return nil
}

// SubCohort returns the silos a cluster leads.
func (p *Plan) SubCohort(name string) []string {
	if c, ok := p.Cluster(name); ok {
		return c.SubCohort
	}
	return nil
}

// Depth returns the number of levels below the root (0: flat).
func (p *Plan) Depth() int {
	d := 0
	for _, c := range p.Clusters {
		d = max(d, c.Depth)
	}
	return d
}

// MaxFanOut returns the largest FanOut() of any cluster.
func (p *Plan) MaxFanOut() int {
	f := 0
	for i := range p.Clusters {
		f = max(f, p.Clusters[i].FanOut())
	}
	return f
}

// clusterName is what a cluster may be called: it may become part of a
// Raft server ID or a directory name.
var clusterName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// maxListed bounds how many member names one diagnostic lists.
const maxListed = 5

// build validates raw clusters against members and returns the plan. Every
// problem is collected; pos positions them at the topology function.
func build(members []Member, raw []Cluster, fanout int, problem func(code diag.Code, format string, args ...any)) *Plan {
	bad := func(format string, args ...any) { problem(diag.TopologyInvalid, format, args...) }
	role := make(map[string]identity.Role, len(members))
	for _, m := range members {
		role[m.Name] = m.Role
	}
	p := &Plan{FanOut: fanout, byName: map[string]int{}, byMember: map[string]int{}}
	roots := 0
	for i, c := range raw {
		if !clusterName.MatchString(c.Name) {
			bad("cluster %q: a cluster name is 1 to 128 lower-case letters, digits, '.', '_' or '-'", c.Name)
		}
		if _, dup := p.byName[c.Name]; dup {
			bad("cluster %q is defined twice", c.Name)
			continue
		}
		p.byName[c.Name] = i
		if c.Parent == "" {
			roots++
		}
	}
	if roots != 1 {
		bad("%d clusters have no parent; a tree has exactly one root", roots)
	}
	badParent := false
	for _, c := range raw {
		if c.Parent == "" {
			continue
		}
		if c.Parent == c.Name {
			bad("cluster %q is its own parent", c.Name)
			badParent = true
		} else if _, ok := p.byName[c.Parent]; !ok {
			bad("cluster %q names parent %q, which is not a cluster", c.Name, c.Parent)
			badParent = true
		}
	}
	// Place members: aggregators as nodes, silos and workers as led.
	where := map[string]string{} // member → cluster, for "placed twice"
	var twice, unknown, misrole []string
	place := func(cluster, m string, asNode bool) bool {
		r, ok := role[m]
		cluster = shown(cluster)
		switch {
		case !ok:
			unknown = append(unknown, fmt.Sprintf("%s (in %s)", shown(m), cluster))
			return false
		case asNode != (r == identity.Aggregator):
			if asNode {
				misrole = append(misrole, fmt.Sprintf("%s is a %s, not an aggregator, yet a node of %s", m, r, cluster))
			} else {
				misrole = append(misrole, fmt.Sprintf("%s is an aggregator, yet led by %s (aggregators are nodes)", m, cluster))
			}
			return false
		}
		if first, dup := where[m]; dup {
			twice = append(twice, fmt.Sprintf("%s (in %s and %s)", m, first, cluster))
			return false
		}
		where[m] = cluster
		return true
	}
	for i := range raw {
		c := &raw[i]
		if len(c.Nodes) == 0 {
			bad("cluster %q has no nodes: every cluster is replicated by at least one aggregator", c.Name)
		}
		for _, m := range c.Nodes {
			place(c.Name, m, true)
		}
		c.SubCohort = nil
		for _, m := range c.Leads {
			if place(c.Name, m, false) && role[m] == identity.Silo {
				c.SubCohort = append(c.SubCohort, m)
			}
		}
	}
	var missing []string
	for _, m := range members {
		if _, ok := where[m.Name]; !ok && !m.Role.Person() {
			missing = append(missing, m.Name)
		}
	}
	for _, l := range []struct {
		what  string
		names []string
	}{
		{"placed twice", twice}, {"not members of the federation", unknown},
		{"not placed in any cluster", missing}, {"in the wrong place", misrole},
	} {
		if len(l.names) > 0 {
			bad("%d member(s) %s: %s", len(l.names), l.what, listSome(l.names))
		}
	}
	if len(p.byName) != len(raw) || roots != 1 || badParent {
		return nil // the tree cannot be walked
	}
	order, depth, kids, ok := walk(raw, bad)
	if !ok {
		return nil
	}
	silosLed := 0
	for _, c := range raw {
		if len(c.SubCohort) > 0 {
			silosLed++
		}
	}
	for _, name := range order {
		c := raw[p.byName[name]]
		c.Depth = depth[name]
		c.Children = slices.Clone(kids[name])
		if c.Children == nil {
			c.Children = []string{}
		}
		if c.Leads == nil {
			c.Leads = []string{}
		}
		if c.SubCohort == nil {
			c.SubCohort = []string{}
		}
		if fanout > 0 && c.FanOut() > fanout {
			bad("cluster %q leads %d members and %d child clusters: %d is over the fan-out limit %d", c.Name, len(c.Leads), len(c.Children), c.FanOut(), fanout)
		}
		if n := len(c.SubCohort); n > 0 && n < secagg.MinSites && silosLed > 1 {
			problem(diag.RunTooFewSites, "cluster %q leads %d silo(s) (%s): each sub-cohort needs at least %d sites, or one could subtract its own update from the partial sum and learn the other's",
				c.Name, n, strings.Join(c.SubCohort, ", "), secagg.MinSites)
		}
		p.Clusters = append(p.Clusters, c)
	}
	for i, c := range p.Clusters {
		p.byName[c.Name] = i
		for _, m := range c.Nodes {
			p.byMember[m] = i
		}
		for _, m := range c.Leads {
			p.byMember[m] = i
		}
	}
	return p
}

// walk orders the clusters from the root down, breadth-first, with each
// one's depth and children; a cluster not reached sits on a cycle (or
// hangs from one), and the tree cannot be walked (ok false).
func walk(raw []Cluster, bad func(format string, args ...any)) (order []string, depth map[string]int, kids map[string][]string, ok bool) {
	kids = map[string][]string{}
	root := ""
	for _, c := range raw {
		if c.Parent == "" {
			root = c.Name
		} else {
			kids[c.Parent] = append(kids[c.Parent], c.Name)
		}
	}
	order = []string{root}
	depth = map[string]int{root: 0}
	for q := 0; q < len(order); q++ {
		for _, k := range kids[order[q]] {
			if _, seen := depth[k]; seen {
				continue
			}
			depth[k] = depth[order[q]] + 1
			order = append(order, k)
		}
	}
	if len(order) != len(raw) {
		var lost []string
		for _, c := range raw {
			if _, ok := depth[c.Name]; !ok {
				lost = append(lost, c.Name)
			}
		}
		bad("cluster(s) %s do not reach the root %q: their parent links form a cycle", listSome(lost), root)
		return nil, nil, nil, false
	}
	return order, depth, kids, true
}

// shown is a name content returned, fit for a diagnostic: as it is when
// it could be a member's or cluster's name, else quoted (control
// characters, a newline forging a line of the report) and cut short.
func shown(name string) string {
	if clusterName.MatchString(name) { // member names are a subset
		return name
	}
	if len(name) > 64 {
		return strconv.Quote(name[:64]) + "…"
	}
	return strconv.Quote(name)
}

// maxIndent is the deepest level WriteText indents.
const maxIndent = 8

// listSome joins the first few names and says how many more there are.
func listSome(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, … (%d more)", strings.Join(names[:maxListed], ", "), len(names)-maxListed)
}

// WriteText writes the plan for people: one block per cluster, indented by
// depth, with its nodes, what it leads and where its sum goes.
func (p *Plan) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(p.Params)) {
		kv = append(kv, fmt.Sprintf("%s=%v", k, p.Params[k]))
	}
	fmt.Fprintf(bw, "topology %s (%s)", p.Topology, p.Ref.Short())
	if len(kv) > 0 {
		fmt.Fprintf(bw, " %s", strings.Join(kv, " "))
	}
	limit := "no fan-out limit"
	if p.FanOut > 0 {
		limit = fmt.Sprintf("fan-out limit %d", p.FanOut)
	}
	fmt.Fprintf(bw, "\n%s, depth %d; %s, largest fan-out %d\n", plural(len(p.Clusters), "cluster"), p.Depth(), limit, p.MaxFanOut())
	// Depth-first, so that children sit under their parent.
	var walk func(i int)
	walk = func(i int) {
		c := &p.Clusters[i]
		// Indentation stops at maxIndent levels, or a deep chain's
		// text would grow as the square of its depth.
		ind := strings.Repeat("  ", min(c.Depth, maxIndent))
		if c.Depth > maxIndent {
			fmt.Fprintf(bw, "\n%scluster %s (depth %d)\n", ind, c.Name, c.Depth)
		} else {
			fmt.Fprintf(bw, "\n%scluster %s\n", ind, c.Name)
		}
		fmt.Fprintf(bw, "%s  nodes     %s\n", ind, listSome(c.Nodes))
		if len(c.Leads) > 0 {
			fmt.Fprintf(bw, "%s  leads     %s, %s: %s\n", ind, plural(len(c.Leads), "member"), plural(len(c.SubCohort), "silo"), listSome(c.Leads))
		}
		if len(c.Children) > 0 {
			fmt.Fprintf(bw, "%s  children  %s\n", ind, listSome(c.Children))
		}
		var parts []string
		if len(c.SubCohort) > 0 {
			parts = append(parts, "its sub-cohort of "+plural(len(c.SubCohort), "silo"))
		}
		if len(c.Children) > 0 {
			parts = append(parts, plural(len(c.Children), "child partial sum"))
		}
		to := "→ the round's sum"
		if c.Parent != "" {
			to = "→ " + c.Parent
		}
		if len(parts) > 0 {
			fmt.Fprintf(bw, "%s  sums      %s %s\n", ind, strings.Join(parts, " + "), to)
		}
		for _, k := range c.Children {
			walk(p.byName[k])
		}
	}
	walk(0)
	return bw.Flush()
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
