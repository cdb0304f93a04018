package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeCommand finds `scellis …` invocations in the README: in code
// blocks and in inline code.
var readmeCommand = regexp.MustCompile("(?m)(?:^\\s*(?:\\$ )?|`)scellis ([a-z][a-z0-9-]*(?: [a-z][a-z0-9-]*)?)")

// Every command the README shows is exercised by a test: a CLI script
// (testdata/script) or a test that runs the binary with the same command
// words. A README command added without a test fails here, naming it.
func TestREADMECommandsExercised(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var corpus strings.Builder
	for _, glob := range []string{"testdata/script/*.txtar", "*_test.go"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if f == "readme_commands_test.go" {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			corpus.Write(b)
		}
	}
	tests := corpus.String()
	root := newRoot()
	seen := map[string]bool{}
	for _, m := range readmeCommand.FindAllStringSubmatch(string(readme), -1) {
		words := strings.Fields(m[1])
		cmd, rest, err := root.Find(words)
		if err != nil || cmd == root {
			continue // prose ("scellis is …"), not a command
		}
		path := strings.Fields(cmd.CommandPath())[1:]
		_ = rest
		key := strings.Join(path, " ")
		if seen[key] {
			continue
		}
		seen[key] = true
		script := "scellis " + key
		quoted := `"` + strings.Join(path, `", "`) + `"`
		if !strings.Contains(tests, script) && !strings.Contains(tests, quoted) {
			t.Errorf("the README shows `scellis %s`, which no test runs (no %q in a script, no %s in a test)", key, script, quoted)
		}
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d README commands: the pattern no longer matches the README", len(seen))
	}
	t.Logf("%d README commands, each exercised", len(seen))
}

// readmeInvocations returns every `scellis …` invocation the README shows:
// inline code spans (split at ", " where a cell lists several) and code-block
// lines, with backslash continuations joined.
func readmeInvocations(readme string) []string {
	var out []string
	lines := strings.Split(readme, "\n")
	inBlock := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			l := strings.TrimPrefix(strings.TrimSpace(line), "$ ")
			for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
				i++
				l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
			}
			if strings.HasPrefix(l, "scellis ") {
				out = append(out, l)
			}
			continue
		}
		for _, span := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(line, -1) {
			for _, part := range strings.Split(span[1], ", ") {
				if strings.HasPrefix(part, "scellis ") {
					out = append(out, part)
				}
			}
		}
	}
	return out
}

var readmeFlag = regexp.MustCompile(`(?:^|[\s\[(])--([a-z][a-z0-9-]*)`)

// Every flag the README shows on a command exists on that command, and every
// alternative of a `scellis job submit\|watch\|…` list is a subcommand: a
// renamed or removed flag cannot leave a README line that fails as SC1202.
func TestREADMEFlagsExist(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	root := newRoot()
	checked := 0
	for _, inv := range readmeInvocations(string(readme)) {
		var words []string
		var alts []string
		for _, w := range strings.Fields(inv)[1:] {
			if parts := strings.Split(w, `\|`); len(parts) > 1 {
				words, alts = append(words, parts[0]), parts[1:]
				break
			}
			if !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(w) {
				break
			}
			words = append(words, w)
		}
		cmd, _, err := root.Find(words)
		if err != nil || cmd == root {
			continue // prose ("scellis v0.2.0"), not a command
		}
		for _, a := range alts {
			if sub, _, err := cmd.Parent().Find([]string{a}); err != nil || sub.Name() != a {
				t.Errorf("README: `%s`: %q is not a subcommand of %q", inv, a, cmd.Parent().CommandPath())
			}
		}
		for _, m := range readmeFlag.FindAllStringSubmatch(inv, -1) {
			checked++
			if cmd.Flag(m[1]) == nil {
				t.Errorf("README: `%s`: %s has no flag --%s", inv, cmd.CommandPath(), m[1])
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d README flags: the extraction no longer matches the README", checked)
	}
	t.Logf("%d README flags checked", checked)
}
