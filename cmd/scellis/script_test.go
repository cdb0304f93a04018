package main

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/internal/testharness"
	"github.com/scellis/scellis/trainer"
)

// TestMain lets testscript run this binary in-process as the `scellis`
// command inside scripts, the way a user runs it.
func TestMain(m *testing.M) {
	sandboxproc.Main() // the aggregator's planner re-executes this binary
	trainer.Main()     // and a silo, to set up a trainer's sandbox
	// The tests run guarded (internal/testharness): the scellis processes
	// they start and their folders — the scellis binary they build
	// (scellisBinary, 50 MB) included — end with the test binary, even
	// when go test is killed.
	testscript.Main(testharness.Wrap(latencyBound{m}), map[string]func(){
		"scellis": func() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// latencyBound runs m's tests with go test's -parallel at twice the
// cores unless the command line sets it. This package's multi-process
// tests (t.Parallel, each with its own processes, ports and folders)
// spend most of their time waiting on elections, deadlines and fsyncs,
// not computing: on two cores, four at a time take the package from
// about 320 s (go test's default, one per core) to about 200 s. They
// wait on events, not sleeps, so the extra load does not make them fail
// (.ci/run has passed -parallel 4 since issue 35).
type latencyBound struct{ m interface{ Run() int } }

func (l latencyBound) Run() int {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(2*runtime.GOMAXPROCS(0)))
	}
	return l.m.Run()
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
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// exitcode N CMD ARGS...: run CMD and require exit code N, so
			// scripts can tell refused input (2) from failure (1).
			"exitcode": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) < 2 {
					ts.Fatalf("usage: exitcode N command [args...]")
				}
				want, err := strconv.Atoi(args[0])
				if err != nil {
					ts.Fatalf("exitcode: %v", err)
				}
				got := 0
				if err := ts.Exec(args[1], args[2:]...); err != nil {
					var ee *exec.ExitError
					if !errors.As(err, &ee) {
						ts.Fatalf("exitcode: %v", err)
					}
					got = ee.ExitCode()
				}
				if (got == want) == neg {
					ts.Fatalf("exit code %d, want %d", got, want)
				}
			},
			// npy FILE V...: write the values as a flat float64 .npy
			// (a trainer's init.npy, say).
			"npy": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) < 1 {
					ts.Fatalf("usage: npy FILE [values...]")
				}
				var v []float64
				for _, a := range args[1:] {
					f, err := strconv.ParseFloat(a, 64)
					ts.Check(err)
					v = append(v, f)
				}
				ts.Check(os.WriteFile(ts.MkAbs(args[0]), trainer.EncodeNPY(v), 0o644))
			},
		},
		Setup: func(env *testscript.Env) error {
			env.Setenv("SCELLIS_HOME", filepath.Join(env.WorkDir, ".scellis"))
			return nil
		},
	})
}
