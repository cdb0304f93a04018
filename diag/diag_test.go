package diag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRenderQuotesLineWithCaret(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "job.yaml")
	os.WriteFile(f, []byte("name: x\n  reduce: sum\n"), 0o644)
	d := New(UnknownKey, "job", "unknown key %q", "reduce").At(f, 2, 3).WithHelp("did you mean %q?", "reducer")
	var b bytes.Buffer
	Render(&b, List{d})
	want := fmt.Sprintf("error[SC1002]: %s:2:3: job: unknown key \"reduce\"\n  |\n2 |   reduce: sum\n  |   ^\n  = help: did you mean \"reducer\"?\n", f)
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// What a diagnostic quotes can be hostile (a binary file given as
// content, a fail() message): control characters and invalid UTF-8 are
// shown as U+FFFD, one for one, so the caret still lines up and no
// escape sequence reaches the terminal; a message keeps its newlines.
func TestRenderControlCharacters(t *testing.T) {
	d := New(StarlarkRuntime, "x\x1b]0;t\a", "fail: \x1b[2Jgone\nline two").
		At("x.star", 1, 4).WithSource("\x1b[31m\xffx = 1").WithHelp("\x1b[0m")
	var b bytes.Buffer
	Render(&b, List{d})
	want := "error[SC2003]: x.star:1:4: x\ufffd]0;t\ufffd: fail: \ufffd[2Jgone\nline two\n  |\n1 | \ufffd[31m\ufffdx = 1\n  |    ^\n  = help: \ufffd[0m\n"
	if b.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", b.String(), want)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	d := New(StepBudget, "program montecarlo-pi", "used %d steps", 10).At("x.star", 3, 1)
	var b bytes.Buffer
	if err := RenderJSON(&b, List{d}); err != nil {
		t.Fatal(err)
	}
	var got struct{ Diagnostics []Diagnostic }
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Diagnostics) != 1 || got.Diagnostics[0].Code != "SC2004" || got.Diagnostics[0].Pos.Line != 3 {
		t.Fatalf("bad round trip: %+v", got)
	}
}

func TestAsUnwraps(t *testing.T) {
	d := New(CSVRagged, "data.csv", "row 3 has 2 fields, want 4")
	err := fmt.Errorf("loading: %w", d)
	l, ok := As(err)
	if !ok || l[0] != d {
		t.Fatal("As did not find the wrapped diagnostic")
	}
	if _, ok := As(fmt.Errorf("plain")); ok {
		t.Fatal("As found a diagnostic in a plain error")
	}
}

// Every code must be documented, so a user who sees one can look it up.
func TestEveryCodeDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/diagnostics.md")
	if err != nil {
		t.Fatal(err)
	}
	codes := Codes()
	if len(codes) == 0 {
		t.Fatal("no codes defined")
	}
	for _, c := range codes {
		if !strings.Contains(string(doc), "`"+string(c)+"`") {
			t.Errorf("code %s (%s) is not documented in docs/diagnostics.md", c, Title(c))
		}
	}
}

// The converse of TestEveryCodeDocumented: every code docs/diagnostics.md
// tabulates is defined, is tabulated once, and its row's meaning starts with
// the code's title — so a renamed, renumbered or removed code cannot leave a
// stale row behind for users to look up.
func TestDocumentedCodesExist(t *testing.T) {
	doc, err := os.ReadFile("../docs/diagnostics.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Code]int{}
	for i, line := range strings.Split(string(doc), "\n") {
		// A table row: | `SCnnnn` | meaning | what to do |
		if !strings.HasPrefix(line, "| `SC") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Errorf("docs/diagnostics.md:%d: malformed row %q", i+1, line)
			continue
		}
		c := Code(strings.Trim(strings.TrimSpace(cells[1]), "`"))
		seen[c]++
		title := Title(c)
		if title == "" {
			t.Errorf("docs/diagnostics.md:%d: %s is documented but not defined in diag/", i+1, c)
			continue
		}
		if meaning := strings.TrimSpace(cells[2]); !strings.HasPrefix(meaning, title) {
			t.Errorf("docs/diagnostics.md:%d: %s's meaning %q does not start with its title %q", i+1, c, meaning, title)
		}
	}
	for c, n := range seen {
		if n > 1 {
			t.Errorf("docs/diagnostics.md: %s is tabulated %d times", c, n)
		}
	}
	for _, c := range Codes() {
		if seen[c] == 0 {
			t.Errorf("%s (%s) has no row in docs/diagnostics.md's tables", c, Title(c))
		}
	}
}
