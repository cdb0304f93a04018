package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/identity"
)

// Dynamic shell completion: `scellis completion bash|zsh|fish|powershell`
// prints cobra's script, which calls back into the binary (`scellis
// __complete …`) as the user types. The first argument of a command
// completes from what it names in its usage line:
//
//	JOB_ID           the pool's jobs (asked of the pool as the member)
//	RUN_ID, RUN      the pool's training runs
//	MEMBER, NAME     the federation's members (aggregators for join/leave)
//	catalog show     the catalog's entries, then files
//
// Completion never prompts and gives up within completionBudget: a pool
// that does not answer completes nothing rather than hanging the shell.

// completionBudget bounds a completion that asks the pool.
const completionBudget = 2 * time.Second

// installCompletion attaches the completion functions to the commands.
func installCompletion(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			walk(s)
		}
		if c.HasSubCommands() || c.ValidArgsFunction != nil {
			return
		}
		fields := strings.Fields(c.Use)
		if len(fields) < 2 {
			return
		}
		var fn cobra.CompletionFunc
		switch arg := fields[1]; {
		case arg == "JOB_ID":
			fn = completeJobs
		case arg == "RUN_ID" || arg == "RUN":
			fn = completeRuns
		case arg == "MEMBER" && c.Parent() != nil && c.Parent().Name() == "aggregator":
			fn = completeMembers(identity.Aggregator)
		case arg == "NAME" && c.Parent() != nil && c.Parent().Name() == "federation" && c.Name() != "add":
			fn = completeMembers("")
		case c.CommandPath() == "scellis catalog show":
			fn = completeCatalog
		}
		if fn != nil {
			c.ValidArgsFunction = fn
		}
	}
	walk(root)
}

// completionMember reads the member flags of cmd (--identity,
// --federation, --passphrase-file, --pool) as the command would.
func completionMember(cmd *cobra.Command) *memberFlags {
	get := func(name string) string {
		v, _ := cmd.Flags().GetString(name)
		return v
	}
	return &memberFlags{identity: get("identity"), passphraseFile: get("passphrase-file"), federation: get("federation"), pool: get("pool")}
}

// withinBudget returns what ask finds, or fallback's answer if ask takes
// longer than completionBudget (ask then runs on while the process exits).
func withinBudget(ask func(ctx context.Context) []cobra.Completion, fallback func() []cobra.Completion) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(context.Background(), completionBudget)
	defer cancel()
	got := make(chan []cobra.Completion, 1)
	go func() { got <- ask(ctx) }()
	select {
	case out := <-got:
		return out, cobra.ShellCompDirectiveNoFileComp
	case <-ctx.Done():
		if fallback != nil {
			return fallback(), cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

func completeJobs(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return withinBudget(func(ctx context.Context) []cobra.Completion {
		c, _, err := completionMember(cmd).client(io.Discard)
		if err != nil {
			return nil
		}
		jobs, err := c.Jobs(ctx)
		if err != nil {
			return nil
		}
		var out []cobra.Completion
		for _, j := range jobs {
			if id := string(j.ID); strings.HasPrefix(id, toComplete) {
				out = append(out, cobra.CompletionWithDesc(id, fmt.Sprintf("%s, %s", j.Name, j.State)))
			}
		}
		return out
	}, nil)
}

func completeRuns(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return withinBudget(func(ctx context.Context) []cobra.Completion {
		c, _, err := completionMember(cmd).client(io.Discard)
		if err != nil {
			return nil
		}
		runs, err := c.Runs(ctx)
		if err != nil {
			return nil
		}
		var out []cobra.Completion
		for _, r := range runs {
			if id := string(r.ID); strings.HasPrefix(id, toComplete) {
				out = append(out, cobra.CompletionWithDesc(id, fmt.Sprintf("%s, %s, %d/%d rounds", r.Name, r.State, len(r.Models), r.Rounds)))
			}
		}
		return out
	}, nil)
}

// completeMembers completes the federation's members of role ("" any):
// those added or revoked through the log when the pool answers within the
// budget, else those of the federation file.
func completeMembers(role identity.Role) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		mf := completionMember(cmd)
		id, fed, err := mf.loadMember(io.Discard)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		file := fed.File
		return withinBudget(func(context.Context) []cobra.Completion {
			followLog(id, fed, "", "")
			return filterMembers(fed.Members, role, toComplete)
		}, func() []cobra.Completion {
			// fed may be being written by the sync: read the file afresh.
			f, err := identity.LoadFederation(file)
			if err != nil {
				return nil
			}
			return filterMembers(f.Members, role, toComplete)
		})
	}
}

func filterMembers(ms []identity.Member, role identity.Role, toComplete string) []cobra.Completion {
	var out []cobra.Completion
	for _, m := range ms {
		if (role == "" || m.Role == role) && strings.HasPrefix(m.Name, toComplete) {
			out = append(out, cobra.CompletionWithDesc(m.Name, string(m.Role)))
		}
	}
	return out
}

func completeCatalog(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, _ := openCatalog()
	if c == nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	var out []cobra.Completion
	for _, e := range c.List() {
		if strings.HasPrefix(e.Name, toComplete) {
			out = append(out, cobra.CompletionWithDesc(e.Name, string(e.Kind)))
		}
	}
	slices.Sort(out)
	// Names first; a file path is a valid argument too.
	return out, cobra.ShellCompDirectiveDefault
}
