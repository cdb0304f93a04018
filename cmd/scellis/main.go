// Command scellis is the federated compute appliance: one binary for the
// solo run, the aggregator, the silo, the worker and the tools around them.
// The CLI is thin: each command parses flags and calls a package.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/memlimit"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/trainer"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

// commands collects the subcommands; each command file adds its own in init.
var commands []func() *cobra.Command

// jsonOutput is the global --json flag: diagnostics and results as JSON.
var jsonOutput bool

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "scellis",
		Short: "Federated compute appliance: federated learning and pooled jobs on one engine",
		Long: `Scellis runs federated-learning rounds and generic pooled jobs (sweeps,
Monte Carlo, k-fold, ensembles) on one engine: Job -> Shards -> verified
Results -> Reduction, with a privacy ledger and hash-chained receipts.

Start with 'scellis demo', or run a job alone with 'scellis run JOB.yaml'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVar(&jsonOutput, "json", false, "print results and diagnostics as JSON")
	for _, c := range commands {
		root.AddCommand(c())
	}
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	hardenCLI(root)
	installCompletion(root)
	return root
}

func init() {
	commands = append(commands, func() *cobra.Command {
		return &cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprintf(cmd.OutOrStdout(), "scellis %s\n", version)
			},
		}
	})
}

// exitError ends the command with a chosen exit code and message (for
// example `ledger verify` exits 1 naming the first bad entry).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// run executes the CLI and returns the process exit code: 0 success, 1
// failure, 2 refused input (a diagnostic).
func run(args []string, stdout, stderr io.Writer) int {
	jsonOutput = false
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if jsonRequested(args) {
		jsonOutput = true // a flag error can stop parsing before --json
	}
	subject := "scellis"
	if cmd != nil {
		subject = cmd.CommandPath()
	}
	return report(err, subject, stderr)
}

// report renders err as diagnostics — every error is one, in JSON under
// --json — and returns the exit code: 2 for refused input, 1 for a
// failure (SC1205, or the code an exitError chose).
func report(err error, subject string, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	render := func(ds diag.List) {
		if jsonOutput {
			diag.RenderJSON(stderr, ds)
		} else {
			diag.Render(stderr, ds)
		}
	}
	if ds, ok := diag.As(err); ok {
		render(ds)
		if ds.HasErrors() {
			return 2
		}
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			render(diag.List{diag.New(diag.CommandFailed, subject, "%s", ee.msg)})
		}
		return ee.code
	}
	if isUsageError(err) {
		// Wrong arguments are refused input: a diagnostic like any other.
		return report(diag.New(diag.BadArguments, "scellis", "%v", err).
			WithHelp("run the command with --help to see its usage"), subject, stderr)
	}
	render(diag.List{diag.New(diag.CommandFailed, subject, "%v", err)})
	return 1
}

// usageError marks bad command-line arguments (exit code 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func isUsageError(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

func main() {
	// A sandbox child (the aggregator's planner re-executes this binary to
	// run submitted content under OS limits) runs its handler and exits.
	sandboxproc.Main()
	// A trainer sandbox's first process (package trainer) sets up the
	// sandbox and executes the trainer's interpreter.
	trainer.Main()
	// Under an address-space limit the garbage collector works hard before
	// the hard limit, and readers of large inputs refuse what would not
	// fit with a diagnostic (internal/memlimit).
	memlimit.Init()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
