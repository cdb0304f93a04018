package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/internal/yamlpos"
	"github.com/scellis/scellis/job"
)

func init() { commands = append(commands, newConfigCmd) }

// configKinds are the appliance configs `config check` knows, each with the
// top-level keys only that kind has (used to guess the kind of a file).
var configKinds = []struct {
	kind string
	keys []string
}{
	{"silo", []string{"datasets", "policy", "ledger"}},
	{"aggregator", []string{"lease_ttl", "join", "snapshot_threshold", "snapshot_interval", "trailing_logs", "segment_bytes"}},
	{"worker", []string{"cache_dir", "parallel", "memory_mb", "shard_timeout", "poll", "corrupt_results"}},
	// Not appliance configs, but files a user hands config check too: they
	// are checked as what they are, not as a silo config with ten errors.
	{"run", []string{"strategy", "model", "dataset", "rounds", "cohort", "secure_aggregation", "aggregation", "standardize", "evaluation"}},
	{"job", []string{"program", "partitioner", "reducer", "verification", "limits", "security_critical"}},
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with appliance config files (silo, aggregator, worker)",
	}
	var kind string
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a silo, aggregator or worker config (or a run spec, job spec or federation file) and report every problem at once",
		Long: `Check an appliance config without starting anything: unknown keys (with a
did-you-mean hint), missing or mistyped values, values out of range, and
what start-up checks: the identity key (present, permissions, passphrase),
the federation file, that the named member exists with the appliance's role
and the key is its key, that data_dir (cache_dir) can be written; for a silo
its datasets (class, finite budget, unit, every row of the CSV file parsed)
and its policy's strategies. Environment overrides (SCELLIS_...) apply as when the
appliance starts. Every problem is reported with its file:line:col; the exit
code is 2 when there is one. Without --kind the kind is guessed from the
file's keys. A run spec (RUN.yaml) is checked as 'scellis fl launch' checks it
(its strategy resolved in the catalog), a job spec as a job file, and a
federation file as 'scellis federation check' does.`,
		Example: `  scellis config check hospital-a.yaml
  scellis config check --kind aggregator agg-1.yaml`,
		Args: exactArgs(1, "FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConfigCheck(args[0], kind, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	check.Flags().StringVar(&kind, "kind", "", "the file's kind: silo, aggregator, worker, run, job or federation (default: guessed from its keys)")
	cmd.AddCommand(check)
	return cmd
}

func runConfigCheck(file, kind string, stdout, stderr io.Writer) error {
	if kind == "" {
		k, err := guessConfigKind(file)
		if err != nil {
			return err
		}
		kind = k
	}
	var (
		c       any
		summary string
	)
	switch kind {
	case "silo":
		s, err := config.LoadSilo(file)
		if err != nil {
			return err
		}
		if _, _, err := checkSilo(s, stderr, false); err != nil {
			return err
		}
		c, summary = s, siloSummary(s)
	case "aggregator":
		a, err := config.LoadAggregator(file)
		if err != nil {
			return err
		}
		if _, _, err := checkAggregator(a, stderr, false); err != nil {
			return err
		}
		if _, err := childDelegate(context.Background(), a, false); err != nil {
			return err
		}
		c, summary = a, fmt.Sprintf("aggregator %s is valid: data in %s, leases of %s", a.Name, a.DataDir, a.LeaseTTL)
		if a.Join {
			summary += ", joins a running cluster"
		}
		if a.ParentFederation != "" {
			summary += fmt.Sprintf(", a node of child cluster %s of the parent in %s", a.DelegateName, a.ParentFederation)
		}
	case "worker":
		w, err := config.LoadWorker(file)
		if err != nil {
			return err
		}
		if _, _, err := checkWorker(w, stderr, false); err != nil {
			return err
		}
		c, summary = w, fmt.Sprintf("worker %s is valid: cache in %s, %s at once, %d MiB and %s per shard",
			w.Name, w.CacheDir, plural(w.Parallel, "shard"), w.MemoryMB, w.ShardTimeout)
	case "federation":
		return runFederationCheck(file, stdout)
	case "run":
		spec, err := fl.LoadRunSpec(file)
		if err != nil {
			return err
		}
		cat, err := openCatalog()
		if err != nil {
			return err
		}
		canon, _, _, err := spec.Resolve(cat, filepath.Dir(file))
		if err != nil {
			return err
		}
		c, summary = spec, runSummary(spec)
		if canon.Trainer != "" {
			// What each silo's policy must list (docs/trainers.md).
			summary += fmt.Sprintf(", trainer %s (%s: silos must list it in policy.trainers)", spec.Trainer, canon.Trainer)
		}
	case "job":
		spec, err := job.LoadSpec(file)
		if err != nil {
			return err
		}
		c, summary = spec, fmt.Sprintf("job %s is well-formed; 'scellis run %s' runs it here, 'scellis job submit %s' on the pool", spec.Name, file, file)
	default:
		d := diag.New(diag.FlagValue, "--kind", "unknown kind %q", kind)
		kinds := []string{"silo", "aggregator", "worker", "run", "job", "federation"}
		if s := diag.Suggest(kind, kinds); s != "" {
			return d.WithHelp("did you mean %q? the kinds are %s", s, strings.Join(kinds, ", "))
		}
		return d.WithHelp("the kinds are %s", strings.Join(kinds, ", "))
	}
	if jsonOutput {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Kind   string `json:"kind"`
			Config any    `json:"config"`
		}{kind, c})
	}
	fmt.Fprintf(stdout, "%s: %s\n", file, summary)
	return nil
}

// runSummary describes a valid run spec on one line.
func runSummary(s *fl.RunSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s is valid: strategy %s, %s on dataset %s, cohorts of %d or more", s.Name, s.Strategy, plural(s.Rounds, "round"), s.Dataset, s.MinCohort)
	if s.DP {
		fmt.Fprintf(&b, ", DP (clip %g, σ %g)", s.Clip, s.Sigma)
	} else {
		b.WriteString(", no DP")
	}
	if s.SecureAgg {
		mode := s.AggregationMode()
		if s.Masking != "" {
			mode += ", " + s.Masking
		}
		fmt.Fprintf(&b, ", secure aggregation (%s)", mode)
	}
	return b.String()
}

// siloSummary describes a valid silo config on one line.
func siloSummary(s *config.Silo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "silo %s is valid: %s (", s.Name, plural(len(s.Datasets), "dataset"))
	for i, d := range s.Datasets {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s, %s-level, ε=%g δ=%g", d.Name, d.Class, d.Unit, d.Budget.Epsilon, d.Budget.Delta)
	}
	p := s.Policy
	fmt.Fprintf(&b, "); accepts %s", strings.Join(p.Strategies, ", "))
	for _, t := range p.Trainers {
		fmt.Fprintf(&b, "; runs trainer %s (%s) with %s", t.Name, content.Ref(t.Hash).Short(), t.Interpreter)
	}
	if p.MaxEpsilonPerRound > 0 {
		fmt.Fprintf(&b, "; ε ≤ %g per round", p.MaxEpsilonPerRound)
	}
	if p.MinNoiseMultiplier > 0 {
		fmt.Fprintf(&b, "; σ ≥ %g", p.MinNoiseMultiplier)
	}
	fmt.Fprintf(&b, "; cohorts of %d or more", p.MinCohort)
	if p.MaxRoundsPerDay > 0 {
		fmt.Fprintf(&b, "; at most %s a day", plural(p.MaxRoundsPerDay, "round"))
	}
	if p.MaxModelParams > 0 {
		fmt.Fprintf(&b, "; models of at most %d parameters", p.MaxModelParams)
	}
	if p.MaxRoundMB > 0 {
		fmt.Fprintf(&b, "; at most %d MB a round", p.MaxRoundMB)
	}
	if p.GenericShards {
		b.WriteString("; runs generic shards too")
	}
	return b.String()
}

// guessConfigKind reads a config's top-level keys and names the kind whose
// own keys (or near misses of them) it has most of.
func guessConfigKind(file string) (string, error) {
	data, err := safefile.ReadFile(file, safefile.MaxConfig)
	if errors.Is(err, safefile.ErrTooLarge) {
		return "", diag.New(diag.InvalidValue, "config", "%s is larger than %s, the limit for config files", file, safefile.Size(safefile.MaxConfig)).
			WithHelp("a config names files (datasets, keys, the federation); it does not hold data")
	}
	if err != nil {
		return "", diag.New(diag.FileUnreadable, "config", "cannot read %s: %v", file, configPathErr(err)).
			WithHelp("check the path of the config file")
	}
	doc, err := yamlpos.Parse(file, data, "config")
	if err != nil {
		return "", err
	}
	var keys []string
	if doc != nil && doc.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(doc.Content); i += 2 {
			keys = append(keys, doc.Content[i].Value)
		}
	}
	for _, k := range keys {
		if k == "members" {
			return "federation", nil
		}
	}
	scores := map[string]int{}
	for _, ck := range configKinds {
		for _, k := range keys {
			if slices.Contains(ck.keys, k) || diag.Suggest(k, ck.keys) != "" {
				scores[ck.kind]++
			}
		}
	}
	kinds := make([]string, 0, len(scores))
	for k := range scores {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return scores[kinds[i]] > scores[kinds[j]] })
	if len(kinds) == 0 || (len(kinds) > 1 && scores[kinds[0]] == scores[kinds[1]]) {
		return "", diag.New(diag.BadArguments, file, "cannot tell from its keys whether this is a silo, aggregator or worker config, a run or job spec or a federation file").
			WithHelp("give --kind silo|aggregator|worker|run|job|federation")
	}
	return kinds[0], nil
}

// configPathErr drops the path from an *os.PathError (the message names it).
func configPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
