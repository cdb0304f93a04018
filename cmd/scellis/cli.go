package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/scellis/scellis/diag"
)

// The command line never surprises: a mistyped command or flag, a flag
// value that does not parse or is out of range, and wrong positional
// arguments are all refused input — a diagnostic with a code (and a "did
// you mean" when there is a near miss) on stderr, exit code 2, nothing on
// stdout, so `ID=$(scellis job sumbit …)` captures nothing instead of help.

// flagRangeKey is the pflag annotation holding a numeric flag's allowed
// range, "min,max" (either side may be empty for unbounded).
const flagRangeKey = "scellis_range"

// flagRange declares the allowed range of a numeric flag of cmd, checked
// before the command runs (SC1203 outside it).
func flagRange(cmd *cobra.Command, name string, lo, hi string) {
	if err := cmd.Flags().SetAnnotation(name, flagRangeKey, []string{lo, hi}); err != nil {
		panic(fmt.Sprintf("flagRange: %v", err)) // a programming error: the flag is not defined
	}
}

// hardenCLI installs the diagnostics on every command of the tree.
func hardenCLI(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.SetFlagErrorFunc(flagError)
		if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
			// A group: its only arguments are its subcommands' names.
			c.Args = cobra.ArbitraryArgs
			c.RunE = groupRun
		} else if validate := c.Args; validate != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := validate(cmd, args); err != nil {
					if _, ok := diag.As(err); ok || isUsageError(err) {
						return err
					}
					return usageError{err}
				}
				return nil
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	root.PersistentPreRunE = checkFlagRanges
	// `scellis help lauch` is an unknown command too, not the root's help.
	for _, c := range root.Commands() {
		if c.Name() == "help" {
			c.Run = nil
			c.RunE = func(_ *cobra.Command, args []string) error {
				cmd, rest, err := root.Find(args)
				if err != nil || cmd == nil {
					return groupRun(root, args)
				}
				if len(rest) > 0 {
					if !cmd.HasSubCommands() {
						return diag.New(diag.UnknownCommand, cmd.CommandPath(), "%s has no subcommand %q", cmd.CommandPath(), rest[0]).
							WithHelp("'scellis help %s' describes it", strings.Join(strings.Fields(cmd.CommandPath())[1:], " "))
					}
					return groupRun(cmd, rest)
				}
				return cmd.Help()
			}
		}
	}
}

// groupRun runs a command that only groups subcommands: with no arguments
// it shows the help (asked for), with any it refuses the unknown command.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() || s.Name() == "help" {
			names = append(names, s.Name())
			names = append(names, s.Aliases...)
		}
	}
	d := diag.New(diag.UnknownCommand, cmd.CommandPath(), "unknown command %q", args[0])
	var visible []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			visible = append(visible, s.Name())
		}
	}
	list := fmt.Sprintf("the commands are %s ('%s --help' says what each does)", strings.Join(visible, ", "), cmd.CommandPath())
	if s := diag.Suggest(args[0], names); s != "" {
		return d.WithHelp("did you mean %q? %s", s, list)
	}
	return d.WithHelp("%s", list)
}

// flagError turns pflag's parse errors into diagnostics.
func flagError(cmd *cobra.Command, err error) error {
	var (
		notExist *pflag.NotExistError
		invalid  *pflag.InvalidValueError
		needArg  *pflag.ValueRequiredError
	)
	switch {
	case errors.As(err, &notExist):
		name := notExist.GetSpecifiedName()
		if short := notExist.GetSpecifiedShortnames(); short != "" {
			d := diag.New(diag.UnknownFlag, cmd.CommandPath(), "unknown flag -%s in -%s", name, short)
			return d.WithHelp("'%s --help' lists the flags", cmd.CommandPath())
		}
		d := diag.New(diag.UnknownFlag, cmd.CommandPath(), "unknown flag --%s", name)
		if s := diag.Suggest(name, flagNames(cmd)); s != "" {
			return d.WithHelp("did you mean --%s? '%s --help' lists the flags", s, cmd.CommandPath())
		}
		return d.WithHelp("'%s --help' lists the flags", cmd.CommandPath())
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return diag.New(diag.FlagValue, cmd.CommandPath(), "--%s %q is not %s", f.Name, invalid.GetValue(), typeWord(f.Value.Type())).
			WithHelp("give --%s %s: %s", f.Name, typeWord(f.Value.Type()), f.Usage)
	case errors.As(err, &needArg):
		f := needArg.GetFlag()
		return diag.New(diag.FlagValue, cmd.CommandPath(), "--%s needs a value", f.Name).
			WithHelp("give --%s %s: %s", f.Name, typeWord(f.Value.Type()), f.Usage)
	}
	return diag.New(diag.BadArguments, cmd.CommandPath(), "%v", err).
		WithHelp("'%s --help' shows the usage", cmd.CommandPath())
}

// flagNames lists the long flags cmd accepts, its inherited ones included.
func flagNames(cmd *cobra.Command) []string {
	var names []string
	add := func(f *pflag.Flag) { names = append(names, f.Name) }
	cmd.Flags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	return names
}

func typeWord(t string) string {
	switch {
	case strings.HasPrefix(t, "int"):
		return "an integer"
	case strings.HasPrefix(t, "uint"):
		return "a non-negative integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "duration":
		return "a duration such as 30s or 5m"
	case t == "bool":
		return "true or false"
	}
	return "a " + t
}

// checkFlagRanges refuses a numeric flag given outside its declared range
// (flagRange), and any non-finite float flag.
func checkFlagRanges(cmd *cobra.Command, _ []string) error {
	var ds diag.List
	cmd.Flags().Visit(func(f *pflag.Flag) {
		t := f.Value.Type()
		if !strings.HasPrefix(t, "int") && !strings.HasPrefix(t, "uint") && !strings.HasPrefix(t, "float") {
			return
		}
		v, err := strconv.ParseFloat(f.Value.String(), 64)
		if err != nil {
			return // pflag parsed it already; a type of its own prints differently
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			ds = append(ds, diag.New(diag.FlagValue, cmd.CommandPath(), "--%s %s is not a finite number", f.Name, f.Value.String()).
				WithHelp("%s", f.Usage))
			return
		}
		r := f.Annotations[flagRangeKey]
		if len(r) != 2 {
			return
		}
		lo, hi := r[0], r[1]
		bad := false
		if lo != "" {
			if l, _ := strconv.ParseFloat(lo, 64); v < l {
				bad = true
			}
		}
		if hi != "" {
			if h, _ := strconv.ParseFloat(hi, 64); v > h {
				bad = true
			}
		}
		if bad {
			ds = append(ds, diag.New(diag.FlagValue, cmd.CommandPath(), "--%s %s is out of range: %s", f.Name, f.Value.String(), rangeText(lo, hi)).
				WithHelp("%s", f.Usage))
		}
	})
	return ds.Err()
}

func rangeText(lo, hi string) string {
	switch {
	case lo != "" && hi != "":
		return fmt.Sprintf("it must be between %s and %s", lo, hi)
	case lo != "":
		return fmt.Sprintf("it must be at least %s", lo)
	}
	return fmt.Sprintf("it must be at most %s", hi)
}

// jsonRequested reports whether args ask for JSON output, so a flag error
// found before --json was parsed still renders as JSON.
func jsonRequested(args []string) bool {
	end := slices.Index(args, "--")
	if end < 0 {
		end = len(args)
	}
	return slices.ContainsFunc(args[:end], func(a string) bool { return a == "--json" || a == "--json=true" })
}
