package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/pool"
	"github.com/scellis/scellis/studio"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/viz"
)

func init() { commands = append(commands, newRunCmd) }

type runOptions struct {
	out     string
	verify  bool
	workers int
	quiet   bool
	ui      string // serve the Studio for this run on this address
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run JOB.yaml",
		Short: "Run a job alone: a pool of one, no coordinator, no network",
		Long: `Run a job in this process: admission (trust regime own), partition into
shards, execute them on all cores in the sandbox, reduce in shard-index order,
and write OUT/result.json citing the job ID and every content and input ref.

For a two-parameter grid sweep it also writes OUT/heatmap.png and prints a
small heatmap. --verify executes every shard twice and compares the bytes.
--ui HOST:PORT serves the Studio, the live web view, for this run: the URL
it prints (with a random one-time token) shows the heatmap filling as shards
land; it stays up after the run until Ctrl-C.`,
		Example: "  scellis run examples/sweep/job.yaml --out out/sweep\n  scellis run examples/montecarlo/job.yaml --verify --json",
		Args:    exactArgs(1, "JOB.yaml"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			_, err := runJob(ctx, args[0], o, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if _, isDiag := diag.As(err); err != nil && !isDiag && ctx.Err() != nil {
				// Interrupted between shards rather than inside one: the
				// same refusal as content stopped mid-step.
				return diag.New(diag.ContentCancelled, "run", "interrupted: %v", err).WithHelp("the run was interrupted; run it again")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&o.out, "out", "", "folder for result.json and other outputs (default out/<job name>)")
	cmd.Flags().BoolVar(&o.verify, "verify", false, "execute every shard twice and require byte-identical results")
	cmd.Flags().IntVar(&o.workers, "workers", 0, "shards to run at once (default: one per CPU)")
	cmd.Flags().StringVar(&o.ui, "ui", "", "serve the live view (Studio) of this run on HOST:PORT, e.g. 127.0.0.1:7480, until Ctrl-C")
	flagRange(cmd, "workers", "0", "4096")
	return cmd
}

// exactArgs is cobra.ExactArgs with a usage error (exit code 2) naming
// what is expected.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s expects %s, got %d argument(s)", cmd.CommandPath(), what, len(args))}
		}
		return nil
	}
}

// openCatalog opens the built-in catalog plus the user's ($SCELLIS_HOME/catalog).
func openCatalog() (*catalog.Catalog, error) {
	return catalog.Open(filepath.Join(scellisHome(), "catalog"))
}

func scellisHome() string {
	if h := os.Getenv("SCELLIS_HOME"); h != "" {
		return h
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".scellis")
	}
	return ".scellis"
}

// runJob is the solo pipeline; the demo calls it too.
func runJob(ctx context.Context, path string, o runOptions, stdout, stderr io.Writer) (*job.Document, error) {
	spec, err := job.LoadSpec(path)
	if err != nil {
		return nil, err
	}
	cat, err := openCatalog()
	if err != nil {
		return nil, err
	}
	plan, err := job.Compile(ctx, spec, cat)
	if err != nil {
		return nil, err
	}
	// A solo run is the own regime: everything is admitted, but the rules
	// still run so that a future rule for own pools applies here too.
	req := plan.AdmissionRequest()
	req.Regime = ""
	if ds := trust.Admit(trust.Own, req); ds.HasErrors() {
		return nil, ds
	}
	out := o.out
	if out == "" {
		out = filepath.Join("out", safeName(spec.Name))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("creating output folder: %w", err)
	}
	resultPath := filepath.Join(out, "result.json")
	// A result.json from an earlier run must not pass for this run's.
	if err := os.Remove(resultPath); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if !jsonOutput && !o.quiet {
		fmt.Fprintf(stdout, "job %s  %s\n", spec.Name, plan.ID)
		fmt.Fprintf(stdout, "  program %s, partitioner %s, reducer %s; %d shards, %d work units\n",
			plan.Program.Name, plan.Partitioner.Name, plan.Reducer.Name, len(plan.Shards), plan.TotalCost())
	}
	bar := newProgress(stderr, "  shards")
	exec := &pool.Local{Workers: o.workers, Verify: o.verify}
	if !jsonOutput && !o.quiet {
		exec.Progress = func(e pool.Event) { bar.update(e.Done, e.Total) }
	}
	var live *studio.Solo
	if o.ui != "" {
		var stop func()
		if live, stop, err = serveSolo(ctx, plan, o.ui, stdout); err != nil {
			return nil, err
		}
		defer stop()
		progress := exec.Progress
		exec.Progress = func(e pool.Event) {
			live.Shard(e.Shard, e.Result)
			if progress != nil {
				progress(e)
			}
		}
	}
	res, err := exec.Run(ctx, plan)
	if err != nil {
		return nil, err
	}
	if live != nil {
		live.Done()
		defer func() {
			fmt.Fprintln(stderr, "the live view stays up until Ctrl-C")
			<-ctx.Done()
		}()
	}
	doc := job.NewDocument(plan, res.Results, res.Reduced, res.Method, res.Unverified)

	cells := make([]viz.Cell, len(res.Results))
	for i, r := range res.Results {
		cells[i] = viz.Cell{Params: plan.Shards[r.Index].Params, Value: r.Value}
	}
	metric, _ := spec.Reducer.Params["metric"].(string)
	grid, isGrid := viz.DetectGrid(cells, metric)
	if isGrid {
		if err := grid.PNG(filepath.Join(out, "heatmap.png")); err != nil {
			return nil, fmt.Errorf("drawing heatmap: %w", err)
		}
		doc.Files = append(doc.Files, "heatmap.png")
	}
	b, err := doc.Marshal()
	if err != nil {
		return nil, err
	}
	if err := job.WriteFileAtomic(resultPath, b); err != nil {
		return nil, err
	}
	if jsonOutput {
		stdout.Write(b)
		return doc, nil
	}
	if o.quiet {
		return doc, nil
	}
	if isGrid {
		grid.Terminal(stdout)
	}
	printSummary(stdout, doc)
	fmt.Fprintf(stdout, "  wrote %s", resultPath)
	for _, f := range doc.Files {
		fmt.Fprintf(stdout, ", %s", filepath.Join(out, f))
	}
	fmt.Fprintln(stdout)
	return doc, nil
}

// serveSolo serves the Studio of a solo run on addr, admitting whoever
// opens the printed URL: its token is 32 random bytes, compared in
// constant time.
func serveSolo(ctx context.Context, plan *job.Plan, addr string, stdout io.Writer) (*studio.Solo, func(), error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, nil, err
	}
	secret := hex.EncodeToString(b[:])
	host, _, _ := net.SplitHostPort(addr)
	cfg, sha, err := studio.SoloTLSConfig(host)
	if err != nil {
		return nil, nil, err
	}
	live := studio.NewSolo(plan)
	bound, stop, err := studio.NewSoloServer(live, secret, nil).Listen(ctx, addr, cfg)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stdout, "  live view: https://%s/?token=%s (certificate SHA-256 %s)\n", bound, secret, sha)
	return live, stop, nil
}

// printSummary shows the reduced result briefly: scalars and small dicts
// in full, the best row of a table, and the size of anything larger.
func printSummary(w io.Writer, doc *job.Document) {
	fmt.Fprintf(w, "  verified %d/%d shards (%s)\n", doc.Verification.Verified, len(doc.Shards), doc.Verification.Method)
	switch v := doc.Result.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %s\n", k, brief(v[k]))
		}
	default:
		fmt.Fprintf(w, "  result: %s\n", brief(v))
	}
}

func brief(v any) string {
	if l, ok := v.([]any); ok && len(l) > 4 {
		return fmt.Sprintf("[%d items]", len(l))
	}
	if l, ok := v.([]float64); ok && len(l) > 4 {
		return fmt.Sprintf("[%d numbers]", len(l))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	s := string(b)
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}

func safeName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '-'
	}, s)
	if s == "" || s == "." || s == ".." {
		return "job"
	}
	return s
}
