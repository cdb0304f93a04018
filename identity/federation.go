package identity

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
	"github.com/scellis/scellis/trust"
)

// Role is what a member does in the federation.
type Role string

const (
	// Aggregator: a replica of the coordinator cluster; serves the control
	// plane (and Raft) at its address, which is required.
	Aggregator Role = "aggregator"
	// Silo: a data custodian; trains locally, may execute shards, may serve.
	Silo Role = "silo"
	// Worker: executes generic shards only; holds no data of its own.
	Worker Role = "worker"
	// Researcher: a person who submits jobs and launches training runs,
	// and may cancel what they submitted. Executes nothing.
	Researcher Role = "researcher"
	// Operator: a person who runs the federation: may cancel any job or
	// run and change the aggregator membership. Submits nothing.
	Operator Role = "operator"
	// Cluster: a child coordinator cluster in a tree of clusters
	// (docs/tree.md). Its nodes share this member's key (the delegate
	// key); its leader leases the parent's shards, has its own cluster
	// compute them, and reports the verified results with its chain head.
	Cluster Role = "cluster"
)

var roles = []string{string(Aggregator), string(Silo), string(Worker), string(Researcher), string(Operator), string(Cluster)}

// Person reports whether r is a role for people (researcher, operator)
// rather than for machines (aggregator, silo, worker).
func (r Role) Person() bool { return r == Researcher || r == Operator }

// ParseRole checks a role name; an unknown one is SC1101.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case Aggregator, Silo, Worker, Researcher, Operator, Cluster:
		return r, nil
	}
	help := "use one of: " + strings.Join(roles, ", ")
	if sug := yamlpos.Suggest(s, roles); sug != "" {
		help = fmt.Sprintf("did you mean %q? %s", sug, help)
	}
	return "", diag.New(diag.MemberRole, "role", "unknown member role %q", s).WithHelp("%s", help)
}

// Member is one entry of the federation file.
type Member struct {
	Name      string
	Role      Role
	PublicKey PublicKey
	// Address is the host:port the member serves on: required for an
	// aggregator (its control-plane API), optional for silos and workers,
	// refused for people (researchers and operators serve nothing).
	Address string
	// RaftAddress is the host:port of an aggregator's Raft transport;
	// optional, and only aggregators may have one.
	RaftAddress string
	// Region is where the member runs, as the operator names it (for
	// example eu-west); optional. A topology may group members by it.
	Region string
	// Capacity is the member's relative capacity in units the operator
	// chooses (cores, GPUs, records): optional, 0 when not given, else 1 to
	// 10^9. A topology may weigh members by it; nothing else reads it.
	Capacity int64
	// Cluster, on a silo of a parent cluster's federation in a tree of
	// clusters (docs/tree.md), names the child cluster (a member of role
	// cluster) that leads the silo: the silo is a member of that child's
	// federation and takes part in rounds there, and a round of the
	// parent sums its sub-cohort at that child (docs/secagg.md,
	// "Hierarchical secure aggregation"). Empty: the silo is led here.
	Cluster string
	// Pos is where the member's entry starts in the federation file.
	Pos diag.Position
}

// Federation is a parsed federation file: its name, its pool regime and its
// members in file order. The file is the bootstrap: a running node replaces
// the effective member list (SetMembers, ApplyChanges) as operator-signed
// membership changes arrive through the Raft log (membership.go), and
// Lookup, Member, ByRole and every TLS config built from the Federation
// follow it at once. Members keeps the file's list. A Federation is safe
// for concurrent use.
type Federation struct {
	File    string
	Name    string
	Regime  trust.Regime
	Members []Member
	live    *liveMembers // nil: the file's members, never changed
}

// maxFederationFile bounds the federation file (about 5,000 members).
const maxFederationFile = 1 << 20

// namePattern is what a federation or member name may be: it becomes a
// certificate subject, a Raft server ID and part of file names.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

var (
	topKeys    = []string{"federation", "regime", "members"}
	memberKeys = []string{"name", "role", "public_key", "address", "raft_address", "region", "capacity", "cluster"}
)

// LoadFederation reads and parses a federation file (see ParseFederation).
// An unreadable file is SC1006.
func LoadFederation(path string) (*Federation, error) {
	data, err := safefile.ReadFile(path, maxFederationFile)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, diag.New(diag.InvalidValue, "federation", "the federation file is larger than %d bytes", maxFederationFile).At(path, 0, 0)
	}
	if err != nil {
		return nil, diag.New(diag.FileUnreadable, "federation", "cannot read %s: %s", path, pathErr(err)).
			WithHelp("check the path of the federation file")
	}
	return ParseFederation(path, data)
}

// ParseFederation parses a federation file, reporting every problem at once
// as a diag.List ordered by position (or one *diag.Diagnostic when the file
// is too big, empty or not YAML): unknown keys (SC1002), wrong types
// (SC1003), missing fields (SC1004), unknown roles (SC1101), malformed keys
// (SC1102), duplicate names (SC1103) or keys (SC1106), bad, missing or
// duplicate addresses (SC1107), bad names (SC1108), no aggregator (SC1109)
// and an unknown regime (SC4004). file names the file in positions.
func ParseFederation(file string, data []byte) (*Federation, error) {
	if len(data) > maxFederationFile {
		return nil, diag.New(diag.InvalidValue, "federation", "the federation file is larger than %d bytes", maxFederationFile).At(file, 0, 0)
	}
	doc, err := yamlpos.Parse(file, data, "federation")
	if err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, diag.New(diag.MissingField, "federation", "the federation file is empty").At(file, 1, 1).
			WithHelp("a federation file needs federation, regime and members; see docs/identity.md")
	}
	d := &yamlpos.Decoder{File: file}
	fed := &Federation{File: file}
	top := d.Fields(doc, "federation", topKeys...)
	if n := d.Required(doc, top, "federation", "federation"); n != nil {
		fed.Name = d.Str(n, "federation")
		if n.Tag == "!!str" && !namePattern.MatchString(fed.Name) {
			badName(d, n, "federation name", fed.Name)
		}
	}
	if n := d.Required(doc, top, "regime", "federation"); n != nil {
		s := d.Str(n, "regime")
		if n.Tag == "!!str" {
			r, err := trust.ParseRegime(s)
			if err != nil {
				dg := err.(*diag.Diagnostic)
				dg.At(file, n.Line, n.Column)
				d.Diags = append(d.Diags, dg)
			}
			fed.Regime = r
		}
	}
	n := d.Required(doc, top, "members", "federation")
	if n == nil {
		return nil, d.Err()
	}
	items := d.Seq(n, "members")
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.Errorf(n, diag.NoAggregator, "members", "add at least one aggregator entry (name, role, public_key, address)", "the federation has no members")
	}
	v := &validator{d: d, names: map[string]*yaml.Node{}, addrs: map[string]*yaml.Node{}}
	for i, item := range items {
		if m, ok := v.member(item, i); ok {
			fed.Members = append(fed.Members, m)
		}
	}
	for _, cn := range v.via {
		if c, ok := fed.Member(cn.Value); !ok || c.Role != Cluster {
			d.Errorf(cn, diag.InvalidValue, "cluster "+cn.Value, "name a member of role cluster of this federation: the child cluster that leads the silo", "%q is not a child cluster of this federation", cn.Value)
		}
	}
	if len(items) > 0 && !v.badRole && len(fed.ByRole(Aggregator)) == 0 && len(fed.Members) == len(items) {
		d.Errorf(n, diag.NoAggregator, "members", "add the aggregator nodes (role: aggregator, with an address); members connect to them", "the federation has no aggregator")
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	fed.live = newLive(fed.Members)
	return fed, nil
}

func badName(d *yamlpos.Decoder, n *yaml.Node, what, name string) {
	d.Diags = append(d.Diags, nameDiag(what, name).At(d.File, n.Line, n.Column))
}

func nameDiag(what, name string) *diag.Diagnostic {
	return diag.New(diag.MemberName, what, "%q is not a valid %s", name, what).
		WithHelp("use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit")
}

// CheckName reports whether s can be a federation or member name: 1 to 63
// lower-case letters, digits, '.', '_' or '-', starting with a letter or
// digit (names become certificate subjects and Raft server IDs). A bad name
// is SC1108.
func CheckName(s string) error {
	if !namePattern.MatchString(s) {
		return nameDiag("name", s)
	}
	return nil
}

// CheckAddress reports whether s is a host:port a member can serve on: a
// non-empty host and a port from 1 to 65535. A bad one is SC1107.
func CheckAddress(s string) error {
	host, port, err := net.SplitHostPort(s)
	p, perr := strconv.Atoi(port)
	if err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
		return diag.New(diag.MemberAddress, "address", "%q is not a host:port", s).
			WithHelp("write host:port, for example agg-1.example.org:7400 or [2001:db8::1]:7400")
	}
	return nil
}

type seenKey struct {
	key  PublicKey
	name string
	line int
}

// validator carries what one member entry is checked against.
type validator struct {
	d       *yamlpos.Decoder
	names   map[string]*yaml.Node // name → its node, for duplicates
	addrs   map[string]*yaml.Node // address → its node, for duplicates
	keys    []seenKey             // every well-formed key so far, for duplicates
	badRole bool
	via     []*yaml.Node // every cluster: field, checked once all members are read
}

func (v *validator) member(n *yaml.Node, i int) (Member, bool) {
	d := v.d
	subject := fmt.Sprintf("members[%d]", i)
	if name := scalarField(n, "name"); namePattern.MatchString(name) {
		subject = fmt.Sprintf("member %q", name)
	}
	m := Member{Pos: diag.Position{File: d.File, Line: n.Line, Col: n.Column}}
	before := len(d.Diags)
	f := d.Fields(n, subject, memberKeys...)
	if n.Kind != yaml.MappingNode {
		return m, false
	}
	if nn := d.Required(n, f, "name", subject); nn != nil {
		m.Name = d.Str(nn, "name")
		if nn.Tag == "!!str" {
			if !namePattern.MatchString(m.Name) {
				badName(d, nn, "member name", m.Name)
			} else if first, dup := v.names[m.Name]; dup {
				d.Errorf(nn, diag.MemberDuplicate, subject, fmt.Sprintf("it is first used on line %d; give each member its own name", first.Line), "member name %q is given twice", m.Name)
			} else {
				v.names[m.Name] = nn
			}
		}
	}
	if rn := d.Required(n, f, "role", subject); rn != nil {
		s := d.Str(rn, "role")
		if rn.Tag == "!!str" {
			r, err := ParseRole(s)
			if err != nil {
				v.badRole = true
				dg := err.(*diag.Diagnostic)
				dg.Subject = subject
				dg.At(d.File, rn.Line, rn.Column)
				d.Diags = append(d.Diags, dg)
			}
			m.Role = r
		} else {
			v.badRole = true
		}
	}
	kn := d.Required(n, f, "public_key", subject)
	if kn != nil {
		s := d.Str(kn, "public_key")
		if kn.Tag == "!!str" {
			k, err := ParsePublicKey(s)
			if err != nil {
				dg := err.(*diag.Diagnostic)
				dg.Subject = subject
				dg.At(d.File, kn.Line, kn.Column)
				d.Diags = append(d.Diags, dg)
			} else {
				v.checkKey(kn, subject, m.Name, k)
			}
			m.PublicKey = k
		}
	}
	if an := f["address"]; an != nil {
		m.Address = v.address(an, subject, "address")
	} else if m.Role == Aggregator {
		d.Errorf(n, diag.MemberAddress, subject, "add address: host:port where this aggregator serves the API", "an aggregator needs an address")
	}
	if an := f["address"]; an != nil && m.Role.Person() {
		d.Errorf(an, diag.MemberAddress, subject, "remove it: researchers and operators only call the aggregators", "a person (%s) serves nothing and has no address", m.Role)
	}
	if an := f["raft_address"]; an != nil {
		m.RaftAddress = v.address(an, subject, "raft_address")
		if m.Role != "" && m.Role != Aggregator {
			d.Errorf(an, diag.MemberAddress, subject, "remove it: only aggregators take part in Raft", "a %s has no Raft address", m.Role)
		}
	}
	if rn := f["region"]; rn != nil {
		m.Region = d.Str(rn, "region")
		if rn.Tag == "!!str" && !namePattern.MatchString(m.Region) {
			d.Errorf(rn, diag.InvalidValue, subject, "use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit (for example eu-west)", "%q is not a valid region", m.Region)
		}
	}
	if cn := f["capacity"]; cn != nil {
		m.Capacity = d.Integer(cn, "capacity", 1, maxCapacity)
	}
	if cn := f["cluster"]; cn != nil {
		m.Cluster = d.Str(cn, "cluster")
		switch {
		case cn.Tag == "!!str" && !namePattern.MatchString(m.Cluster):
			badName(d, cn, "cluster name", m.Cluster)
		case m.Role != "" && m.Role != Silo:
			d.Errorf(cn, diag.InvalidValue, subject, "remove it: only a silo is led by a child cluster (docs/tree.md)", "a %s names no cluster", m.Role)
		default:
			v.via = append(v.via, cn)
		}
	}
	return m, len(d.Diags) == before
}

// maxCapacity bounds a member's capacity so that a topology can sum the
// capacities of 10^5 members without overflow in any unit.
const maxCapacity = 1_000_000_000

// checkKey reports a key already listed for another member, comparing in
// constant time.
func (v *validator) checkKey(n *yaml.Node, subject, name string, k PublicKey) {
	for _, s := range v.keys {
		if s.key.Equal(k) {
			v.d.Errorf(n, diag.PublicKeyDuplicate, subject,
				fmt.Sprintf("member %q on line %d has the same key; every member needs its own key (scellis keygen)", s.name, s.line),
				"this public key is already listed for member %q", s.name)
			return
		}
	}
	v.keys = append(v.keys, seenKey{k, name, n.Line})
}

// scalarField returns the string value of key in mapping n, or "".
func scalarField(n *yaml.Node, key string) string {
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode && n.Content[i+1].Tag == "!!str" {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// address checks a host:port and that no other member uses it.
func (v *validator) address(n *yaml.Node, subject, key string) string {
	d := v.d
	s := d.Str(n, key)
	if n.Tag != "!!str" {
		return ""
	}
	if err := CheckAddress(s); err != nil {
		dg := err.(*diag.Diagnostic)
		dg.Subject = subject
		dg.Message = key + " " + dg.Message
		d.Diags = append(d.Diags, dg.At(d.File, n.Line, n.Column))
		return ""
	}
	if first, dup := v.addrs[s]; dup {
		d.Errorf(n, diag.MemberAddress, subject, fmt.Sprintf("it is first used on line %d; each member serves on its own address", first.Line), "address %q is used twice", s)
		return s
	}
	v.addrs[s] = n
	return s
}

// Lookup finds the member with public key k. It compares k with every
// member's key in constant time and always scans the whole list.
func (f *Federation) Lookup(k PublicKey) (Member, bool) {
	var found Member
	ok := false
	for _, m := range f.current() {
		if m.PublicKey.Equal(k) && !ok {
			found, ok = m, true
		}
	}
	return found, ok
}

// Member finds a member by name.
func (f *Federation) Member(name string) (Member, bool) {
	for _, m := range f.current() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// ByRole returns the members with role r, in file order.
func (f *Federation) ByRole(r Role) []Member {
	var out []Member
	for _, m := range f.current() {
		if m.Role == r {
			out = append(out, m)
		}
	}
	return out
}

// errNotMember builds the SC1110 diagnostic for an identity or name that is
// not in the federation.
func (f *Federation) errNotMember(format string, args ...any) error {
	return diag.New(diag.NotAMember, "federation "+f.Name, format, args...).
		WithHelp("add the member's entry (name, role, public_key) to %s; 'scellis keygen' prints one", f.fileName())
}

func (f *Federation) fileName() string {
	if f.File == "" {
		return "the federation file"
	}
	return f.File
}
