package identity

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// keys returns the text form of seeded(1..n) public keys.
func keys(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = seeded(byte(i + 1)).Public().String()
	}
	return out
}

var goodFederation = `# St Mary's consortium
federation: st-mary
regime: consortium
members:
  - name: agg-1
    role: aggregator
    public_key: %s
    address: 127.0.0.1:7401
    raft_address: 127.0.0.1:7501
  - name: hospital-a
    role: silo
    public_key: %s
    address: "[::1]:7601"
  - name: w1
    role: worker
    public_key: %s
`

func TestParseFederation(t *testing.T) {
	src := fmt.Sprintf(goodFederation, keys(3)...)
	fed, err := ParseFederation("fed.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if fed.Name != "st-mary" || fed.Regime != trust.Consortium || len(fed.Members) != 3 {
		t.Fatalf("%+v", fed)
	}
	agg := fed.Members[0]
	if agg.Name != "agg-1" || agg.Role != Aggregator || agg.Address != "127.0.0.1:7401" || agg.RaftAddress != "127.0.0.1:7501" ||
		!agg.PublicKey.Equal(seeded(1).Public()) || agg.Pos != (diag.Position{File: "fed.yaml", Line: 5, Col: 5}) {
		t.Fatalf("aggregator %+v", agg)
	}
	m, ok := fed.Lookup(seeded(2).Public())
	if !ok || m.Name != "hospital-a" || m.Address != "[::1]:7601" {
		t.Fatalf("Lookup: %+v %v", m, ok)
	}
	if _, ok := fed.Lookup(seeded(9).Public()); ok {
		t.Fatal("Lookup found a key that is not listed")
	}
	if m, ok := fed.Member("w1"); !ok || m.Role != Worker || m.Address != "" {
		t.Fatalf("Member: %+v %v", m, ok)
	}
	if got := fed.ByRole(Silo); len(got) != 1 || got[0].Name != "hospital-a" {
		t.Fatalf("ByRole: %+v", got)
	}
}

// Every problem of a file is reported at once, each at its line:col.
func TestParseFederationReportsEverything(t *testing.T) {
	k := keys(3)
	src := fmt.Sprintf(`federation: St Mary
regime: consortum
colour: blue
members:
  - name: agg-1
    role: aggregator
    public_key: %s
  - name: agg-1
    role: agregator
    public_key: ed25519:tooshort
    address: 127.0.0.1:7401
  - name: h-b
    role: silo
    public_key: %s
    address: nohost
    raft_address: 127.0.0.1:7501
    adress: x
  - name: h-c
    role: silo
    public_key: %s
  - name: 42
    role: worker
  - name: w-2
    role: worker
    public_key: %s
    address: 127.0.0.1:7401
`, k[0], k[1], k[0], k[2])
	_, err := ParseFederation("fed.yaml", []byte(src))
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("no diagnostics: %v", err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, fmt.Sprintf("%d:%d %s", d.Pos.Line, d.Pos.Col, d.Code))
	}
	want := []string{
		"1:13 SC1108",  // federation name with a space and capitals
		"2:9 SC4004",   // unknown regime
		"3:1 SC1002",   // unknown key
		"5:5 SC1107",   // aggregator without address
		"8:11 SC1103",  // agg-1 twice
		"9:11 SC1101",  // unknown role
		"10:17 SC1102", // malformed key
		"15:14 SC1107", // address without port
		"16:19 SC1107", // raft_address on a silo
		"17:5 SC1002",  // unknown key adress
		"20:17 SC1106", // h-c reuses agg-1's key
		"21:5 SC1004",  // missing public_key
		"21:11 SC1003", // name is a number
		"26:14 SC1107", // address used twice
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s\n\n%v", strings.Join(got, "\n"), strings.Join(want, "\n"), err)
	}
	// Help names the first occurrence.
	for _, d := range ds {
		if d.Code == diag.MemberDuplicate && !strings.Contains(d.Help, "line 5") {
			t.Errorf("duplicate help %q", d.Help)
		}
		if d.Code == diag.MemberRole && !strings.Contains(d.Help, `"aggregator"`) {
			t.Errorf("role help %q", d.Help)
		}
	}
}

func TestParseFederationShapes(t *testing.T) {
	for name, tc := range map[string]struct {
		src  string
		code diag.Code
	}{
		"empty":         {"", diag.MissingField},
		"comments":      {"# nothing\n", diag.MissingField},
		"syntax":        {"federation: [x\n", diag.YAMLSyntax},
		"two docs":      {"federation: a\n---\nfederation: b\n", diag.YAMLSyntax},
		"not a map":     {"- a\n", diag.WrongType},
		"no members":    {"federation: a\nregime: own\n", diag.MissingField},
		"empty list":    {"federation: a\nregime: own\nmembers: []\n", diag.NoAggregator},
		"members map":   {"federation: a\nregime: own\nmembers: {a: 1}\n", diag.WrongType},
		"member str":    {"federation: a\nregime: own\nmembers: [x]\n", diag.WrongType},
		"no regime":     {"federation: a\nmembers: []\n", diag.MissingField},
		"dup key":       {"federation: a\nfederation: b\nregime: own\nmembers: []\n", diag.ConfigDuplicate},
		"no aggregator": {fmt.Sprintf("federation: a\nregime: own\nmembers:\n  - {name: w, role: worker, public_key: %s}\n", keys(1)...), diag.NoAggregator},
	} {
		_, err := ParseFederation("f.yaml", []byte(tc.src))
		ds, ok := diag.As(err)
		if !ok {
			t.Errorf("%s: no diagnostics (%v)", name, err)
			continue
		}
		found := false
		for _, d := range ds {
			found = found || d.Code == tc.code
			if d.Pos == nil || d.Pos.File != "f.yaml" {
				t.Errorf("%s: %s without the file position", name, d.Code)
			}
		}
		if !found {
			t.Errorf("%s: got %v, want %s", name, err, tc.code)
		}
	}
}

func TestLoadFederation(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "fed.yaml")
	os.WriteFile(p, []byte(fmt.Sprintf(goodFederation, keys(3)...)), 0o644)
	fed, err := LoadFederation(p)
	if err != nil || fed.File != p || len(fed.Members) != 3 {
		t.Fatalf("%v %+v", err, fed)
	}
	_, err = LoadFederation(filepath.Join(dir, "missing.yaml"))
	wantCode(t, err, diag.FileUnreadable)
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, make([]byte, maxFederationFile+1), 0o644)
	_, err = LoadFederation(big)
	wantCode(t, err, diag.InvalidValue)
}

func TestParseRole(t *testing.T) {
	for _, r := range []Role{Aggregator, Silo, Worker, Researcher, Operator} {
		if got, err := ParseRole(string(r)); err != nil || got != r {
			t.Errorf("ParseRole(%q) = %v, %v", r, got, err)
		}
	}
	wantCode(t, func() error { _, err := ParseRole("Silo"); return err }(), diag.MemberRole)
}

// People are members too: a researcher and an operator parse, and a person
// with an address is refused at the address's line.
func TestParseFederationPeople(t *testing.T) {
	src := fmt.Sprintf(goodFederation+"  - name: ada\n    role: researcher\n    public_key: %s\n  - name: ops\n    role: operator\n    public_key: %s\n", keys(5)...)
	fed, err := ParseFederation("fed.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := fed.Member("ada"); m.Role != Researcher || !m.Role.Person() {
		t.Fatalf("ada: %+v", m)
	}
	if m, _ := fed.Member("ops"); m.Role != Operator || !m.Role.Person() {
		t.Fatalf("ops: %+v", m)
	}
	if Worker.Person() || Silo.Person() || Aggregator.Person() {
		t.Fatal("a machine role counts as a person")
	}
	_, err = ParseFederation("fed.yaml", []byte(src+"    address: 127.0.0.1:9\n"))
	ds, ok := diag.As(err)
	if !ok || len(ds) != 1 || ds[0].Code != diag.MemberAddress || ds[0].Pos.Line != 23 || !strings.Contains(ds[0].Message, "person") {
		t.Fatalf("a person with an address: %v", err)
	}
}

// region and capacity are optional attributes a topology reads; a bad value
// is reported at its line:col with the other problems.
func TestParseFederationRegionCapacity(t *testing.T) {
	k := keys(4)
	src := fmt.Sprintf(`federation: st-mary
regime: consortium
members:
  - name: agg-1
    role: aggregator
    public_key: %s
    address: 127.0.0.1:7401
    region: eu-west
  - name: h-a
    role: silo
    public_key: %s
    region: us-east
    capacity: 8
  - name: h-b
    role: silo
    public_key: %s
`, k[0], k[1], k[2])
	fed, err := ParseFederation("fed.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if m := fed.Members; m[0].Region != "eu-west" || m[0].Capacity != 0 || m[1].Region != "us-east" || m[1].Capacity != 8 || m[2].Region != "" {
		t.Fatalf("members %+v", m)
	}
	bad := fmt.Sprintf(`federation: st-mary
regime: consortium
members:
  - name: agg-1
    role: aggregator
    public_key: %s
    address: 127.0.0.1:7401
    region: EU West
    capacity: 0
  - name: h-a
    role: silo
    public_key: %s
    region: 3
    capacity: many
`, k[0], k[1])
	_, err = ParseFederation("fed.yaml", []byte(bad))
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("no diagnostics: %v", err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, fmt.Sprintf("%d:%d %s", d.Pos.Line, d.Pos.Col, d.Code))
	}
	want := "8:13 SC1005\n9:15 SC1005\n13:13 SC1003\n14:15 SC1003"
	if strings.Join(got, "\n") != want {
		t.Fatalf("got\n%s\nwant\n%s\n\n%v", strings.Join(got, "\n"), want, err)
	}
}
