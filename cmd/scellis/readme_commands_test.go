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
