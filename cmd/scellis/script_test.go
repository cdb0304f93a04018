package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestMain lets testscript run this binary in-process as the `scellis`
// command inside scripts, the way a user runs it.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"scellis": func() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs cmd/scellis/testdata/script/*.txtar: CLI tests written as
// shell-like scripts with expected output (like age's cmd/age/testdata).
func TestScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/script/*.txtar")
	if len(files) == 0 {
		t.Fatal("no CLI scripts found: the test corpus vanished")
	}
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: false,
		Setup: func(env *testscript.Env) error {
			env.Setenv("SCELLIS_HOME", filepath.Join(env.WorkDir, ".scellis"))
			return nil
		},
	})
}
