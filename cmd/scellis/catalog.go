package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
)

func init() { commands = append(commands, newCatalogCmd) }

func newCatalogCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "List, show and add content: programs, partitioners, reducers, strategies",
		Long: `The catalog holds the Starlark content jobs run: programs, partitioners,
reducers, strategies and the libraries they load. Each entry is named after
its file and addressed by the SHA-256 of its source; its kind comes from the
functions it defines (run, partition, reduce, client_step + server_step).

Built-in entries are embedded in the binary; your own live in
$SCELLIS_HOME/catalog (default ~/.scellis/catalog) and load exactly the same
way. See docs/content.md for the contracts and the sandbox.`,
	}
	cmd.AddCommand(newCatalogLsCmd(), newCatalogShowCmd(), newCatalogAddCmd())
	return cmd
}

// userCatalogDir is where `catalog add` stores entries.
func userCatalogDir() string { return filepath.Join(scellisHome(), "catalog") }

// entryJSON is an entry for --json output.
type entryJSON struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Ref    string   `json:"ref"`
	Path   string   `json:"path"`
	Doc    string   `json:"doc,omitempty"`
	Loads  []string `json:"loads,omitempty"`
	Funcs  []string `json:"funcs"`
	Source string   `json:"source,omitempty"`
}

func toJSON(e *catalog.Entry, withSource bool) entryJSON {
	j := entryJSON{Name: e.Name, Kind: string(e.Kind), Ref: string(e.Ref), Path: e.Path, Doc: e.Doc, Loads: e.Loads, Funcs: e.Funcs}
	if withSource {
		j.Source = string(e.Source)
	}
	return j
}

func writeCatalogJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// docLine is the first sentence of a docstring without its "name: "
// prefix, shortened to fit a terminal line.
func docLine(e *catalog.Entry) string {
	para, _, _ := strings.Cut(e.Doc, "\n\n")
	s := strings.Join(strings.Fields(para), " ")
	s = strings.TrimPrefix(s, e.Name+": ")
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if r := []rune(s); len(r) > 72 {
		s = string(r[:71]) + "…"
	}
	return s
}

func newCatalogLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List catalog entries: name, kind, short ref and what each does",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A broken user file is reported after the listing of the
			// entries that did load.
			c, openErr := openCatalog()
			if c == nil {
				return openErr
			}
			out := cmd.OutOrStdout()
			list := c.List()
			if jsonOutput {
				js := make([]entryJSON, len(list))
				for i, e := range list {
					js[i] = toJSON(e, false)
				}
				if err := writeCatalogJSON(out, js); err != nil {
					return err
				}
				return openErr
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tREF\tDESCRIPTION")
			for _, e := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Name, e.Kind, e.Ref.Short(), docLine(e))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return openErr
		},
	}
}

func newCatalogShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "show NAME|REF|FILE",
		Short:   "Show an entry's metadata and source",
		Example: "  scellis catalog show grid\n  scellis catalog show sha256:…\n  scellis catalog show ./my-reducer.star",
		Args:    exactArgs(1, "a name, a sha256: ref or a .star file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := openCatalog()
			if c == nil {
				return err
			}
			wd, _ := os.Getwd()
			e, rerr := c.Resolve(args[0], wd)
			if rerr != nil {
				return rerr
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeCatalogJSON(out, toJSON(e, true))
			}
			fmt.Fprintf(out, "name:  %s\nkind:  %s\nref:   %s\npath:  %s\n", e.Name, e.Kind, e.Ref, e.Path)
			if len(e.Loads) > 0 {
				fmt.Fprintf(out, "loads: %s\n", strings.Join(e.Loads, ", "))
			}
			fmt.Fprintf(out, "funcs: %s\n\n", strings.Join(e.Funcs, ", "))
			src := string(e.Source)
			fmt.Fprint(out, src)
			if !strings.HasSuffix(src, "\n") {
				fmt.Fprintln(out)
			}
			return nil
		},
	}
}

func newCatalogAddCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "add FILE",
		Short: "Check a .star file and add it to your catalog; prints its ref",
		Long: `Parse FILE, deduce its kind, check that everything it loads is in the
catalog and that its name is free, then copy it into $SCELLIS_HOME/catalog.
The entry is named after the file (my-reducer.star adds my-reducer) and the
ref printed is the SHA-256 of its bytes. Adding the same file again is
harmless; a different file under a name already taken is refused.`,
		Example: "  scellis catalog add my-reducer.star",
		Args:    exactArgs(1, "a .star file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			src, err := catalog.ReadSource(path)
			if err != nil {
				return err
			}
			e, err := catalog.Parse(path, src)
			if err != nil {
				return err
			}
			// Check against what is there, even if another user file is
			// broken: that one is not this command's business.
			dir := userCatalogDir()
			c, openErr := catalog.Open(dir)
			if c == nil {
				return openErr
			}
			_, had := c.Lookup(e.Name)
			if err := c.Add(e); err != nil {
				return err
			}
			if _, err := c.Closure(e); err != nil {
				return err
			}
			if err := catalog.Store(dir, e); err != nil {
				return err
			}
			stored := filepath.Join(dir, e.Name+".star")
			if jsonOutput {
				j := toJSON(e, false)
				j.Path = stored
				return writeCatalogJSON(cmd.OutOrStdout(), j)
			}
			verb := "added"
			if had {
				verb = "already holds"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "scellis: catalog %s %s %s (%s)\n", verb, e.Kind, e.Name, stored)
			fmt.Fprintln(cmd.OutOrStdout(), e.Ref)
			if ds, ok := diag.As(openErr); ok {
				// Warn about the user's other broken files without failing.
				for _, d := range ds {
					d.Severity = diag.Warning
				}
				return ds
			}
			return nil
		},
	}
}
