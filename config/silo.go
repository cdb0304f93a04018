package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/trust"
)

// Silo configures `scellis silo`: who the silo is, where its federation
// and state are, the datasets it holds and the policy it applies to every
// round request before doing anything (package silo checks it).
type Silo struct {
	File           string
	Pos            Positions `json:"-"`
	Name           string    // this silo's member name in the federation file
	Identity       string    // private key file (scellis keygen)
	PassphraseFile string    // for an encrypted key file
	Federation     string    // federation file
	DataDir        string    // model checkpoints, client state (e.g. SCAFFOLD's c_i)
	Ledger         string    // privacy ledger; default DataDir/privacy.ledger
	LogLevel       string    // off, error, warn, info, debug
	LogFormat      string    // text (default) or json
	MetricsListen  string    // /metrics in plain HTTP (empty: off)
	// ParentFederation, for a silo led by a child cluster in a tree of
	// clusters, is the parent cluster's federation file, which lists
	// this silo with `cluster: CHILD`: before the silo sends anything
	// keyed to a hierarchical round's Params it asks a parent aggregator
	// whether the bundle its child served is the parent's (silo/parent.go;
	// docs/tree.md). Empty: no such check.
	ParentFederation string
	// The data plane (docs/dataplane.md), as a worker's: round bundles,
	// models and secure-aggregation messages go over data channels to
	// the aggregators (ICEPolicy all or relay), HTTPS being the last
	// fallback, or over HTTPS only (https, a silo's default: a data
	// channel to a round host that dies is noticed only after ICE gives
	// up and a redial times out, longer than a round's join timeout, so
	// rounds across leader changes failed until the run paused).
	// P2PLoopback is deprecated and accepted, as a worker's: implied by
	// a federation on loopback addresses.
	ICEPolicy   string
	STUN        []string
	P2PVia      string
	P2PLoopback bool
	// Poll is how long the leader may hold the silo's lease request when
	// there is nothing to lease (a long poll: a new round reaches the silo
	// at once). The polls are the silo's heartbeat: keep it well below
	// the aggregators' silo_lease. Default 2 s.
	Poll time.Duration
	// SiloLease is the aggregators' silo_lease as the silo's operator
	// knows it (default DefaultSiloLease, the aggregators' default): the
	// config is refused when Poll is not below it. The leader also never
	// holds a poll longer than half its lease, whatever Poll says.
	SiloLease time.Duration
	Datasets  []Dataset
	Policy    SiloPolicy
}

// Dataset is one dataset a silo holds. Its budget is what the silo declares
// in its ledger; once declared there the ledger's budget is the one charged.
type Dataset struct {
	Name   string
	Path   string // CSV file with a header row
	Label  string // the label column
	Class  trust.Class
	Budget Budget
	// Unit is the unit of privacy DP protects: fl.UnitRecord (DP-SGD,
	// per example; the default) or fl.UnitSilo (the whole update).
	Unit fl.Unit
	// PublicRows: the data owner agrees that the dataset's row count is
	// not secret, so a run's statistics step may sum it unnoised
	// (privacy.public_rows). Default false: the count is noised and
	// charged like the sums.
	PublicRows bool
	// Pos is where the dataset's entry is in the config file.
	Pos diag.Position
}

// Budget is a dataset's privacy budget: its cumulative ε at δ may never
// exceed Epsilon.
type Budget struct {
	Epsilon float64
	Delta   float64
}

// SiloPolicy is what a silo accepts of a round request. Zero values of the
// optional limits mean "no limit beyond the ledger".
type SiloPolicy struct {
	// Strategies lists the accepted aggregation strategies by catalog
	// name or sha256: ref. Default: DefaultStrategies.
	Strategies []string
	// MaxEpsilonPerRound caps the ε one round may cost a dataset (at the
	// dataset's δ); 0 means no cap.
	MaxEpsilonPerRound float64
	// MinNoiseMultiplier is the smallest σ a round may use; 0 means none.
	MinNoiseMultiplier float64
	// MinCohort is the fewest sites a round may have; at least 3 (with
	// two, secure aggregation lets each learn the other's update).
	MinCohort int
	// MaxRoundsPerDay caps the rounds the silo takes part in over any 24
	// hours; 0 means no cap.
	MaxRoundsPerDay int
	// GenericShards: the silo also executes generic pool shards (sweeps,
	// Monte Carlo, …), not only its own training rounds. Default false.
	GenericShards bool
	// Aggregation lists the secure-aggregation modes the silo takes part
	// in ("masking", "threshold-he"); empty: both.
	Aggregation []string
	// SecAggThreshold is the lowest pairwise-masking threshold the silo
	// accepts: ThresholdTwoThirds (the default, ⌊2n/3⌋+1: private against
	// an aggregator that equivocates while colluding with fewer than n/3
	// sites) or ThresholdMajority (⌊n/2⌋+1: against an aggregator acting
	// alone only, in exchange for tolerating more dropouts).
	SecAggThreshold string
	// MaxModelParams bounds the parameters of a model the silo trains
	// (a run's model.NumParams); 0 means no bound beyond the model
	// package's sanity limit. How large a model a site can hold is its
	// operator's call, not the run spec parser's.
	MaxModelParams int
	// MaxRoundMB bounds the megabytes a round moves through the silo,
	// counted as 8 bytes per value: the global model's parameters it
	// fetches plus the values it sums (the update and any metrics); 0
	// means no bound.
	MaxRoundMB int
	// Trainers lists the trainers (docs/trainers.md) the silo runs, each
	// by content hash, with the interpreter and limits it runs under.
	// Empty: the silo runs none, and declines trainer runs (SC9502).
	Trainers []Trainer
}

// Trainer is one trainer a silo's policy allows.
type Trainer struct {
	Name string
	// Hash is the trainer's content hash (scellis trainer check DIR).
	Hash string
	// Interpreter runs its entry point, e.g. /usr/bin/python3.
	Interpreter string
	CPUSeconds  int
	MemoryMB    int
	Wall        time.Duration
	// Pos is where the entry is in the config file.
	Pos diag.Position
}

// The values of policy.secagg_threshold.
const (
	ThresholdTwoThirds = "two-thirds"
	ThresholdMajority  = "majority"
)

// DefaultStrategies are the strategies a silo accepts when its policy
// names none: the built-in ones, which ship with the binary. A strategy
// written by a user must be listed explicitly.
func DefaultStrategies() []string {
	return []string{"fedavg", "fedprox", "scaffold", "diloco", "fedbuff"}
}

// MinSites is the fewest sites of any round: with two, each could subtract
// its own update from the securely aggregated sum and learn the other's.
const MinSites = 3

// Dataset returns the dataset called name.
func (c *Silo) Dataset(name string) (Dataset, bool) {
	for _, d := range c.Datasets {
		if d.Name == name {
			return d, true
		}
	}
	return Dataset{}, false
}

// datasetName is what a dataset may be called: it appears in ledger
// entries, diagnostics and environment variable names.
var datasetName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// LoadSilo reads a silo config: YAML with SCELLIS_… environment overrides
// (SCELLIS_POLICY_MIN_COHORT, SCELLIS_DATASETS_<NAME>_BUDGET_EPSILON, …),
// unknown keys refused, relative paths resolved against the file's folder.
// It reports every problem at once, each at file:line:col: besides the
// generic config codes, bad classes (SC4005), δ outside (0, 1) (SC5003), a
// dataset CSV that cannot be read (SC3001), has no header (SC3005) or lacks
// the label column (SC3003).
func LoadSilo(file string) (*Silo, error) {
	c := &Silo{File: file, LogLevel: "warn", Poll: DefaultSiloPoll, SiloLease: DefaultSiloLease, Policy: SiloPolicy{MinCohort: MinSites, SecAggThreshold: ThresholdTwoThirds}, ICEPolicy: "https"}
	strategies := DefaultStrategies()
	var datasets []*Dataset
	var trainers []*Trainer
	p := &c.Policy
	fields := []field{
		mk("name", true, "the silo's member name in the federation file", str(&c.Name)),
		mk("identity", true, "the private key file made by scellis keygen", str(&c.Identity)),
		mk("passphrase_file", false, "", str(&c.PassphraseFile)),
		mk("federation", true, "the federation file listing every member", str(&c.Federation)),
		mk("data_dir", true, "a folder for model checkpoints and client state", str(&c.DataDir)),
		mk("ledger", false, "", str(&c.Ledger)),
		mk("poll", false, "", duration(&c.Poll)),
		mk("silo_lease", false, "", duration(&c.SiloLease)),
		mk("log_level", false, "", parsed(func(s string) error {
			if !contains(logLevels, s) {
				return fmt.Errorf("unknown log level %q", s)
			}
			c.LogLevel = s
			return nil
		}, logLevels...)),
		mk("log_format", false, "", logFormat(&c.LogFormat)),
		mk("metrics_listen", false, "", str(&c.MetricsListen)),
		mk("parent_federation", false, "", str(&c.ParentFederation)),
		mk("ice_policy", false, "", icePolicy(&c.ICEPolicy)),
		mk("stun", false, "", strs(&c.STUN, stunURL)),
		mk("p2p_via", false, "", str(&c.P2PVia)),
		mk("p2p_loopback", false, "", boolean(&c.P2PLoopback)),
		mk("datasets", true, "list the datasets the silo holds (name, path, label, class, budget)",
			sections("dataset", func(name string) []field {
				ds := &Dataset{Name: name, Unit: fl.UnitRecord}
				datasets = append(datasets, ds)
				return datasetFields(ds)
			})),
		siloPolicyField(p, &strategies, &trainers),
	}
	l, err := load(file, "silo config", fields)
	if l == nil {
		return nil, err
	}
	c.Pos = l.positions()
	p.Strategies = strategies
	if n := l.node("policy.strategies"); n != nil && n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
		l.d.Errorf(n, diag.InvalidValue, "policy.strategies", "list the strategies the silo accepts, or remove the key to accept the built-in ones",
			"the policy accepts no strategy, so the silo would refuse every round")
	}
	if c.Poll >= c.SiloLease {
		// A silo's polls are its heartbeat: polling no faster than the
		// lease, a live silo would be counted out between two polls.
		l.errorf("poll", diag.InvalidValue, "poll",
			"keep poll at most half of silo_lease (default poll 2s, silo_lease 6s); if the aggregators' silo_lease is longer, give it here as silo_lease",
			"poll %v is not below silo_lease %v: the aggregators would count this silo dead between two of its polls", c.Poll, c.SiloLease)
	}
	if n := l.node("datasets"); n != nil && len(n.Content) == 0 && (n.Kind == yaml.SequenceNode || n.Kind == yaml.MappingNode) {
		l.d.Errorf(n, diag.MissingField, "datasets", "add at least one dataset (name, path, label, class, budget)", "the silo holds no dataset")
	}

	c.Identity = resolve(file, c.Identity)
	c.PassphraseFile = resolve(file, c.PassphraseFile)
	c.Federation = resolve(file, c.Federation)
	c.ParentFederation = resolve(file, c.ParentFederation)
	c.DataDir = resolve(file, c.DataDir)
	c.Ledger = resolve(file, c.Ledger)
	if c.Ledger == "" && c.DataDir != "" {
		c.Ledger = filepath.Join(c.DataDir, "privacy.ledger")
	}
	c.Datasets = checkDatasets(l, file, datasets)
	p.Trainers = checkTrainers(l, file, trainers)
	if err := l.d.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// siloPolicyField is the policy: section of a silo config; it fills p,
// the accepted strategies and the trainers the policy allows.
func siloPolicyField(p *SiloPolicy, strategies *[]string, trainers *[]*Trainer) field {
	return mk("policy", false, "", section(
		mk("strategies", false, "", strs(strategies, checkStrategyRef)),
		mk("max_epsilon_per_round", false, "", number(&p.MaxEpsilonPerRound, positive("max_epsilon_per_round", "a per-round cap such as 0.5"))),
		mk("min_noise_multiplier", false, "", number(&p.MinNoiseMultiplier, func(v float64) error {
			if v < 0 {
				return fmt.Errorf("min_noise_multiplier = %g is negative", v)
			}
			return nil
		})),
		mk("min_cohort", false, "", count(&p.MinCohort, func(v int) error {
			if v < MinSites {
				return diag.New(diag.InvalidValue, "", "min_cohort = %d is below %d", v, MinSites).
					WithHelp("a round needs at least three sites besides the aggregator (with two, each could learn the other's update from the sum); give 3 or more")
			}
			return nil
		})),
		mk("max_rounds_per_day", false, "", count(&p.MaxRoundsPerDay, func(v int) error {
			if v < 1 {
				return diag.New(diag.InvalidValue, "", "max_rounds_per_day = %d must be at least 1", v).
					WithHelp("remove the key for no daily limit")
			}
			return nil
		})),
		mk("max_model_params", false, "", integer(&p.MaxModelParams, 1, 1<<40)),
		mk("max_round_mb", false, "", integer(&p.MaxRoundMB, 1, 1<<30)),
		mk("generic_shards", false, "", boolean(&p.GenericShards)),
		mk("secagg_threshold", false, "", parsed(func(s string) error {
			if s != ThresholdTwoThirds && s != ThresholdMajority {
				return diag.New(diag.InvalidValue, "", "unknown secure-aggregation threshold %q", s).
					WithHelp("use two-thirds (the default: private against an aggregator colluding with fewer than a third of the sites) or majority (against an aggregator acting alone only; more dropouts tolerated)")
			}
			p.SecAggThreshold = s
			return nil
		}, ThresholdTwoThirds, ThresholdMajority)),
		mk("trainers", false, "", sections("trainer", func(name string) []field {
			t := &Trainer{Name: name}
			*trainers = append(*trainers, t)
			return trainerFields(t)
		})),
		mk("aggregation", false, "", strs(&p.Aggregation, func(s string) error {
			if s != "masking" && s != "threshold-he" {
				return diag.New(diag.InvalidValue, "", "unknown aggregation mode %q", s).
					WithHelp("list masking, threshold-he or both (remove the key to allow both)")
			}
			return nil
		})),
	))
}

// checkDatasets places, resolves and checks the datasets a silo config
// lists, and returns those that can be used.
func checkDatasets(l *loaded, file string, datasets []*Dataset) []Dataset {
	var out []Dataset
	for _, ds := range datasets {
		key := "datasets." + ds.Name
		if n := l.nodes[key]; n != nil {
			ds.Pos = diag.Position{File: file, Line: n.Line, Col: n.Column}
		}
		ds.Path = resolve(file, ds.Path)
		if ds.Name == "" {
			continue // reported as a missing name; nothing to check it by
		}
		if !datasetName.MatchString(ds.Name) {
			at := l.nodes[key]
			l.d.Errorf(at, diag.InvalidValue, "dataset "+fmt.Sprintf("%q", ds.Name),
				"use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit",
				"%q is not a valid dataset name", ds.Name)
			continue
		}
		if ds.Path != "" && ds.Label != "" {
			checkCSV(l, key, ds)
		}
		out = append(out, *ds)
	}
	return out
}

// checkTrainers places and checks the trainers a silo's policy allows.
func checkTrainers(l *loaded, file string, trainers []*Trainer) []Trainer {
	var out []Trainer
	for _, t := range trainers {
		key := "policy.trainers." + t.Name
		if n := l.nodes[key]; n != nil {
			t.Pos = diag.Position{File: file, Line: n.Line, Col: n.Column}
		}
		subject := fmt.Sprintf("trainer %q", t.Name)
		if t.Hash != "" && !content.IsRef(t.Hash) {
			l.errorf(key+".hash", diag.InvalidValue, subject, "give the sha256: hash scellis trainer check DIR prints (a policy allows content, never a path)",
				"%q is not a content hash", t.Hash)
		}
		if t.Interpreter != "" {
			if st, err := os.Stat(t.Interpreter); !filepath.IsAbs(t.Interpreter) || err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				l.errorf(key+".interpreter", diag.InvalidValue, subject, "give the absolute path of an installed interpreter, e.g. /usr/bin/python3 (Debian's python3, with python3-numpy and python3-torch)",
					"interpreter %q is not an executable file", t.Interpreter)
			}
		}
		out = append(out, *t)
	}
	return out
}

func trainerFields(t *Trainer) []field {
	return []field{
		mk("hash", true, "the trainer's content hash, as scellis trainer check DIR prints it", str(&t.Hash)),
		mk("interpreter", true, "the interpreter that runs the trainer, e.g. /usr/bin/python3", str(&t.Interpreter)),
		mk("cpu_seconds", false, "", count(&t.CPUSeconds, atLeastOne("cpu_seconds"))),
		mk("memory_mb", false, "", count(&t.MemoryMB, atLeastOne("memory_mb"))),
		mk("wall", false, "", duration(&t.Wall)),
	}
}

func atLeastOne(key string) func(int) error {
	return func(v int) error {
		if v < 1 {
			return diag.New(diag.InvalidValue, "", "%s = %d must be at least 1", key, v).WithHelp("remove the key for the default")
		}
		return nil
	}
}

var logLevels = []string{"off", "error", "warn", "info", "debug"}

var units = []string{string(fl.UnitRecord), string(fl.UnitSilo)}

func datasetFields(ds *Dataset) []field {
	return []field{
		mk("path", true, "the dataset's CSV file (relative paths resolve against the config file's folder)", str(&ds.Path)),
		mk("label", true, "the CSV column that holds the labels", str(&ds.Label)),
		mk("class", true, "class the dataset confidential or public", parsed(func(s string) error {
			cl, err := trust.ParseClass(s)
			if err == nil {
				ds.Class = cl
			}
			return err
		}, string(trust.Confidential), string(trust.Public))),
		mk("budget", true, "give the dataset's privacy budget: budget: {epsilon: 3, delta: 1e-5}", section(
			mk("epsilon", true, "the most ε the dataset may ever spend, e.g. 3", number(&ds.Budget.Epsilon, positive("budget epsilon", "a budget such as 3 or 8"))),
			mk("delta", true, "δ well below 1/n for n records, e.g. 1e-5", number(&ds.Budget.Delta, func(v float64) error {
				if !(v > 0 && v < 1) {
					return diag.New(diag.DPBadDelta, "", "budget delta = %g is outside (0, 1)", v).
						WithHelp("give a δ well below 1/n for n records, e.g. 1e-5")
				}
				return nil
			})),
		)),
		mk("unit", false, "", parsed(func(s string) error {
			if !contains(units, s) {
				return fmt.Errorf("unknown unit of privacy %q", s)
			}
			ds.Unit = fl.Unit(s)
			return nil
		}, units...)),
		mk("public_rows", false, "", boolean(&ds.PublicRows)),
	}
}

func positive(what, example string) func(float64) error {
	return func(v float64) error {
		if !(v > 0) {
			return diag.New(diag.InvalidValue, "", "%s = %g must be positive", what, v).WithHelp("give %s", example)
		}
		return nil
	}
}

// checkStrategyRef accepts a catalog name or a well-formed sha256: ref; a
// file path cannot be a policy (the content behind it can change).
func checkStrategyRef(s string) error {
	switch {
	case strings.HasPrefix(s, "sha256:") && !content.IsRef(s):
		return diag.New(diag.InvalidValue, "", "%q is not a well-formed ref", s).
			WithHelp("a ref is sha256: followed by 64 lower-case hex digits, as scellis catalog ls --json prints")
	case strings.ContainsAny(s, `/\`) || strings.HasSuffix(s, ".star"):
		return diag.New(diag.InvalidValue, "", "%q is a file path; a policy names strategies by catalog name or sha256: ref", s).
			WithHelp("add the file to the catalog (scellis catalog add FILE) and list its name or ref")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkCSV parses a dataset's CSV in full, as the silo does when it trains,
// so config check refuses what start-up and training would: an unreadable
// file or one that is not a regular file, a missing label column, ragged
// rows, fields that are not finite numbers (NaN, Inf), no data rows.
func checkCSV(l *loaded, key string, ds *Dataset) {
	subject := fmt.Sprintf("dataset %q", ds.Name)
	_, err := model.LoadCSV(ds.Path, ds.Label)
	if err == nil {
		return
	}
	var dg *diag.Diagnostic
	if !errors.As(err, &dg) {
		l.errorf(key+".path", diag.CSVUnreadable, subject, "check the path (relative paths resolve against the config file's folder) and that the silo may read it",
			"cannot read %s: %v", ds.Path, err)
		return
	}
	// Report at the config's key, so every problem of the config is at a
	// place in it; the message names the line of the CSV.
	at, msg, help := key+".path", dg.Message, dg.Help
	if dg.Code == diag.CSVNoLabel {
		at = key + ".label"
	}
	if dg.Code == diag.CSVUnreadable && (dg.Pos == nil || dg.Pos.Line == 0) {
		help = "check the path (relative paths resolve against the config file's folder) and that the silo may read it"
	}
	if dg.Pos != nil && dg.Pos.Line > 0 {
		msg = fmt.Sprintf("%s:%d: %s", filepath.Base(ds.Path), dg.Pos.Line, msg)
	}
	l.errorf(at, dg.Code, subject, help, "%s", msg)
}
