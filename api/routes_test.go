package api

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/identity"
)

// rolesIn parses the "who may call" cell of a docs table row.
func rolesIn(cell string) []string {
	if strings.Contains(cell, "every member") {
		return nil
	}
	var out []string
	for _, r := range []identity.Role{identity.Aggregator, identity.Silo, identity.Worker, identity.Researcher, identity.Operator, identity.Cluster} {
		if regexp.MustCompile(`\b` + string(r) + `\b`).MatchString(cell) {
			out = append(out, string(r))
		}
	}
	return out
}

// documented reads the endpoint table of a Markdown file: endpoint → roles.
func documented(t *testing.T, file string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(GET|POST|PUT) ([^`]+)` \\| ([^|]+) \\|")
	out := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		if strings.HasPrefix(m[2], "/volunteer/") {
			continue // the volunteer listener's (package volunteer checks its table)
		}
		out[m[1]+" "+m[2]] = rolesIn(m[3])
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no endpoints", file)
	}
	return out
}

// Every endpoint's roles are documented as served, in docs/api.md and
// SECURITY.md, and nothing else is documented.
func TestEndpointsDocumented(t *testing.T) {
	for _, file := range []string{"../docs/api.md", "../SECURITY.md"} {
		docs := documented(t, file)
		for _, e := range Endpoints() {
			var want []string
			for _, r := range e.Roles {
				want = append(want, string(r))
			}
			got, ok := docs[e.String()]
			if !ok {
				t.Errorf("%s does not list %s", file, e)
				continue
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s lists %s for %v; it is served for %v", file, e, got, want)
			}
			delete(docs, e.String())
		}
		for e := range docs {
			t.Errorf("%s lists %s, which is not served", file, e)
		}
	}
}

// Every control-plane endpoint has a handler (Handler panics otherwise).
func TestEveryEndpointRouted(t *testing.T) {
	(&Server{}).Handler()
}
