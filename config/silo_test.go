package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/trust"
)

// writeFiles writes name → content under a temporary folder and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// where lists the diagnostics as "CODE line:col" for comparison.
func where(err error) []string {
	ds, _ := diag.As(err)
	var out []string
	for _, d := range ds {
		s := string(d.Code)
		if d.Pos != nil {
			s += fmt.Sprintf(" %d:%d", d.Pos.Line, d.Pos.Col)
		}
		out = append(out, s)
	}
	return out
}

const cardioCSV = "age,bmi,outcome\n54,27.1,1\n"

const goodSilo = `# St Mary's, hospital A
name: hospital-a
identity: keys/identity.key
passphrase_file: keys/passphrase
federation: ../federation.yaml
data_dir: state
datasets:
  - name: cardio
    path: data/cardio.csv
    label: outcome
    class: confidential
    budget: {epsilon: 3, delta: 1e-5}
  - name: registry
    path: /abs/registry.csv
    label: y
    class: public
    unit: silo
    budget:
      epsilon: 8
      delta: 1e-6
policy:
  strategies: [fedavg, fedprox, "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"]
  max_epsilon_per_round: 0.5
  min_noise_multiplier: 0.8
  min_cohort: 4
  max_rounds_per_day: 24
  generic_shards: true
`

func TestLoadSilo(t *testing.T) {
	dir := writeFiles(t, map[string]string{"site/data/cardio.csv": cardioCSV, "abs/registry.csv": "x,y\n1,0\n"})
	file := filepath.Join(dir, "site", "silo.yaml")
	os.WriteFile(file, []byte(strings.ReplaceAll(goodSilo, "/abs/", dir+"/abs/")), 0o644)
	c, err := LoadSilo(file)
	if err != nil {
		t.Fatal(err)
	}
	site := filepath.Join(dir, "site")
	if c.Name != "hospital-a" || c.Identity != filepath.Join(site, "keys/identity.key") ||
		c.PassphraseFile != filepath.Join(site, "keys/passphrase") || c.Federation != filepath.Join(dir, "federation.yaml") ||
		c.DataDir != filepath.Join(site, "state") || c.Ledger != filepath.Join(site, "state", "privacy.ledger") || c.LogLevel != "warn" {
		t.Fatalf("top level: %+v", c)
	}
	want := []Dataset{
		{Name: "cardio", Path: filepath.Join(site, "data/cardio.csv"), Label: "outcome", Class: trust.Confidential,
			Budget: Budget{3, 1e-5}, Unit: fl.UnitRecord, Pos: diag.Position{File: file, Line: 8, Col: 11}},
		{Name: "registry", Path: filepath.Join(dir, "abs/registry.csv"), Label: "y", Class: trust.Public,
			Budget: Budget{8, 1e-6}, Unit: fl.UnitSilo, Pos: diag.Position{File: file, Line: 13, Col: 11}},
	}
	if !slices.Equal(c.Datasets, want) {
		t.Fatalf("datasets\n got %+v\nwant %+v", c.Datasets, want)
	}
	p := c.Policy
	if !slices.Equal(p.Strategies, []string{"fedavg", "fedprox", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}) ||
		p.MaxEpsilonPerRound != 0.5 || p.MinNoiseMultiplier != 0.8 || p.MinCohort != 4 || p.MaxRoundsPerDay != 24 || !p.GenericShards {
		t.Fatalf("policy %+v", p)
	}
	if d, ok := c.Dataset("registry"); !ok || d.Label != "y" {
		t.Fatalf("Dataset(registry) = %+v, %v", d, ok)
	}
	if _, ok := c.Dataset("nope"); ok {
		t.Fatal("Dataset(nope) found")
	}
}

// A dataset's row count is secret unless its declaration says
// public_rows: true (a run's privacy.public_rows needs it).
func TestLoadSiloPublicRows(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{{"", false}, {"    public_rows: true\n", true}, {"    public_rows: false\n", false}} {
		dir := writeFiles(t, map[string]string{
			"cardio.csv": cardioCSV,
			"silo.yaml": "name: h\nidentity: id.key\nfederation: fed.yaml\ndata_dir: st\ndatasets:\n  cardio:\n    path: cardio.csv\n    label: outcome\n" +
				"    class: confidential\n" + tc.line + "    budget: {epsilon: 1, delta: 1e-5}\n"})
		c, err := LoadSilo(filepath.Join(dir, "silo.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Datasets[0].PublicRows != tc.want {
			t.Errorf("%q: public_rows %v", tc.line, c.Datasets[0].PublicRows)
		}
	}
}

// The mapping form names datasets by their keys; the policy section and
// most keys have defaults.
func TestLoadSiloMappingFormAndDefaults(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"cardio.csv": cardioCSV,
		"silo.yaml": `name: h
identity: id.key
federation: fed.yaml
data_dir: /var/lib/scellis
ledger: ledger/privacy.ledger
datasets:
  cardio:
    path: cardio.csv
    label: outcome
    class: confidential
    budget: {epsilon: 1, delta: 1e-5}
`})
	c, err := LoadSilo(filepath.Join(dir, "silo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Datasets) != 1 || c.Datasets[0].Name != "cardio" || c.Datasets[0].Unit != fl.UnitRecord ||
		c.Datasets[0].Pos.Line != 7 {
		t.Fatalf("datasets %+v", c.Datasets)
	}
	if c.Ledger != filepath.Join(dir, "ledger/privacy.ledger") || c.DataDir != "/var/lib/scellis" {
		t.Fatalf("paths: ledger %s, data_dir %s", c.Ledger, c.DataDir)
	}
	want := SiloPolicy{Strategies: DefaultStrategies(), MinCohort: 3}
	if !slices.Equal(c.Policy.Strategies, want.Strategies) || c.Policy.MinCohort != 3 ||
		c.Policy.MaxEpsilonPerRound != 0 || c.Policy.MinNoiseMultiplier != 0 || c.Policy.MaxRoundsPerDay != 0 || c.Policy.GenericShards {
		t.Fatalf("default policy %+v", c.Policy)
	}
}

// Every problem at once, each at its file:line:col, nested keys included.
func TestLoadSiloReportsEverything(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"data/cardio.csv": cardioCSV,
		"data/empty.csv":  "",
		"data/only.csv":   "y\n1\n",
		"silo.yaml": `name: hospital-a
identity: keys/identity.key
federation: federation.yaml
colour: blue
log_level: loud
datasets:
  - name: cardio
    path: data/cardio.csv
    label: Outcome
    class: confidental
    budget: {epsilon: 0, delta: 1.5}
  - name: cardio
    path: data/cardio.csv
    label: outcome
    class: public
    budget: {epsilon: 1, delta: 1e-5}
  - name: other
    path: data/missing.csv
    label: y
    class: public
    unit: person
    budgte: {}
  - path: data/cardio.csv
  - name: empty
    path: data/empty.csv
    label: y
    class: public
    budget: {epsilon: 1}
  - name: only
    path: data/only.csv
    label: y
    class: 3
    budget: {epsilon: 1, delta: 1e-5, epsilom: 2}
  - name: "bad name"
    path: data/cardio.csv
    label: outcome
    class: public
    budget: {epsilon: 1, delta: 1e-5}
policy:
  strategies: [fedavg, ./my.star, "sha256:abc"]
  min_cohort: 2
  max_rounds_per_dya: 3
  max_epsilon_per_round: -1
  generic_shards: yes please
`})
	_, err := LoadSilo(filepath.Join(dir, "silo.yaml"))
	want := []string{
		"SC1004 1:1",   // data_dir missing
		"SC1002 4:1",   // colour
		"SC1005 5:12",  // log_level loud
		"SC3003 9:12",  // label Outcome: did you mean outcome
		"SC4005 10:12", // class confidental
		"SC1005 11:23", // epsilon 0
		"SC5003 11:33", // delta 1.5
		"SC1007 12:11", // cardio again
		"SC1004 17:5",  // other: budget missing
		"SC3001 18:11", // missing.csv
		"SC1005 21:11", // unit person
		"SC1002 22:5",  // budgte
		"SC1004 23:5",  // an entry without a name, label, class and budget
		"SC1004 23:5",
		"SC1004 23:5",
		"SC1004 23:5",
		"SC3005 25:11", // empty.csv
		"SC1004 28:13", // delta missing inside budget
		"SC3005 30:11", // only.csv: no feature column
		"SC1003 32:12", // class 3
		"SC1002 33:39", // epsilom
		"SC1005 34:11", // "bad name"
		"SC1005 40:24", // ./my.star
		"SC1005 40:35", // sha256:abc
		"SC1005 41:15", // min_cohort 2
		"SC1002 42:3",  // max_rounds_per_dya
		"SC1005 43:26", // max_epsilon_per_round -1
		"SC1003 44:19", // generic_shards
	}
	if got := where(err); !slices.Equal(got, want) {
		t.Fatalf("diagnostics\n got %q\nwant %q\n%v", got, want, err)
	}
	text := err.Error()
	for _, s := range []string{
		`did you mean "outcome"?`, `did you mean "confidential"?`, `did you mean "budget"?`,
		`did you mean "max_rounds_per_day"?`, `did you mean "epsilon"?`,
		"first given on line 7", "three sites", "datasets.cardio.budget.delta", "dataset \"other\"",
	} {
		if !strings.Contains(text, s) {
			t.Errorf("diagnostics lack %q:\n%s", s, text)
		}
	}
}

func TestLoadSiloEnvironment(t *testing.T) {
	dir := writeFiles(t, map[string]string{"cardio.csv": cardioCSV, "other.csv": "a,lbl\n1,0\n", "silo.yaml": goodSilo})
	file := filepath.Join(dir, "silo.yaml")
	os.WriteFile(file, []byte(strings.NewReplacer("data/cardio.csv", "cardio.csv", "/abs/registry.csv", "other.csv", "label: y", "label: lbl").Replace(goodSilo)), 0o644)
	t.Setenv("SCELLIS_NAME", "hospital-b")
	t.Setenv("SCELLIS_POLICY_MIN_COHORT", "7")
	t.Setenv("SCELLIS_POLICY_STRATEGIES", "fedavg, scaffold")
	t.Setenv("SCELLIS_POLICY_GENERIC_SHARDS", "false")
	t.Setenv("SCELLIS_DATASETS_CARDIO_BUDGET_EPSILON", "2.5")
	t.Setenv("SCELLIS_DATASETS_REGISTRY_CLASS", "confidential")
	t.Setenv("SCELLIS_LEDGER", "elsewhere.ledger")
	c, err := LoadSilo(file)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "hospital-b" || c.Policy.MinCohort != 7 || c.Policy.GenericShards ||
		!slices.Equal(c.Policy.Strategies, []string{"fedavg", "scaffold"}) ||
		c.Datasets[0].Budget.Epsilon != 2.5 || c.Datasets[1].Class != trust.Confidential ||
		c.Ledger != filepath.Join(dir, "elsewhere.ledger") {
		t.Fatalf("overrides not applied: %+v", c)
	}

	// Bad values from the environment are reported naming the variable.
	t.Setenv("SCELLIS_POLICY_MIN_COHORT", "2")
	t.Setenv("SCELLIS_DATASETS_CARDIO_BUDGET_DELTA", "1")
	t.Setenv("SCELLIS_DATASETS_CARDIO_LABEL", "nope")
	_, err = LoadSilo(file)
	if got := where(err); !slices.Equal(got, []string{"SC5003", "SC1005", "SC3003 0:0"}) {
		t.Fatalf("diagnostics %q:\n%v", got, err)
	}
	for _, s := range []string{"SCELLIS_POLICY_MIN_COHORT", "SCELLIS_DATASETS_CARDIO_BUDGET_DELTA", "(from SCELLIS_DATASETS_CARDIO_LABEL)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("diagnostics lack %q:\n%v", s, err)
		}
	}
}

func TestLoadSiloFileProblems(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"empty.yaml":  "# nothing yet\n",
		"syntax.yaml": "name: [\n",
		"list.yaml":   "name: h\nidentity: i\nfederation: f\ndata_dir: d\ndatasets: cardio\n",
		"none.yaml":   "name: h\nidentity: i\nfederation: f\ndata_dir: d\ndatasets: []\npolicy:\n  strategies: []\n",
		"shape.yaml":  "name: h\nidentity: i\nfederation: f\ndata_dir: d\ndatasets: {c: {budget: 3}, d: [1]}\npolicy: 4\n",
	})
	cases := map[string][]string{
		"missing.yaml": {"SC1006"},
		"syntax.yaml":  {"SC1001 1:0"},
		"empty.yaml":   {"SC1004 1:1", "SC1004 1:1", "SC1004 1:1", "SC1004 1:1", "SC1004 1:1"},
		"list.yaml":    {"SC1003 5:11"},
		"none.yaml":    {"SC1004 5:11", "SC1005 7:15"},
		// a malformed section is one problem, not one per missing key
		"shape.yaml": {"SC1004 5:15", "SC1004 5:15", "SC1004 5:15", "SC1003 5:24", "SC1003 5:31", "SC1003 6:9"},
	}
	for name, want := range cases {
		_, err := LoadSilo(filepath.Join(dir, name))
		if got := where(err); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q\n%v", name, got, want, err)
		}
	}
}

// The generalised loader keeps the aggregator and worker configs as they
// were: defaults, relative paths, environment overrides, every problem.
func TestLoadAppliances(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"agg.yaml":    "name: agg-1\nidentity: k/id.key\nfederation: fed.yaml\ndata_dir: raft\nlease_ttl: 1m\njoin: true\n",
		"worker.yaml": "name: w\nidentity: id.key\nfederation: fed.yaml\ncache_dir: cache\nparallel: 4\n",
		"bad.yaml":    "name: w\nidentiy: id.key\nparallel: 0\npoll: soon\n",
	})
	a, err := LoadAggregator(filepath.Join(dir, "agg.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if a.LeaseTTL != time.Minute || !a.Join || a.LogLevel != "warn" || a.DataDir != filepath.Join(dir, "raft") || a.Identity != filepath.Join(dir, "k/id.key") {
		t.Fatalf("aggregator %+v", a)
	}
	t.Setenv("SCELLIS_SHARD_TIMEOUT", "90s")
	w, err := LoadWorker(filepath.Join(dir, "worker.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if w.Parallel != 4 || w.MemoryMB != 512 || w.ShardTimeout != 90*time.Second || w.CacheDir != filepath.Join(dir, "cache") {
		t.Fatalf("worker %+v", w)
	}
	_, err = LoadWorker(filepath.Join(dir, "bad.yaml"))
	want := []string{"SC1004 1:1", "SC1004 1:1", "SC1004 1:1", "SC1002 2:1", "SC1005 3:11", "SC1005 4:7"}
	if got := where(err); !slices.Equal(got, want) {
		t.Fatalf("bad worker: %q, want %q\n%v", got, want, err)
	}
	if !strings.Contains(err.Error(), `did you mean "identity"?`) {
		t.Fatalf("no hint: %v", err)
	}
	t.Setenv("SCELLIS_PARALLEL", "many")
	if _, err := LoadWorker(filepath.Join(dir, "worker.yaml")); err == nil || !strings.Contains(err.Error(), "SCELLIS_PARALLEL") {
		t.Fatalf("bad environment value: %v", err)
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("datasets.cardio-2.budget.epsilon"); got != "SCELLIS_DATASETS_CARDIO_2_BUDGET_EPSILON" {
		t.Fatal(got)
	}
}

// A section absent from the file still takes environment overrides.
func TestLoadSiloEnvironmentWithoutSection(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"cardio.csv": cardioCSV,
		"silo.yaml":  "name: h\nidentity: i\nfederation: f\ndata_dir: d\ndatasets:\n  cardio: {path: cardio.csv, label: outcome, class: public, budget: {epsilon: 1, delta: 1e-5}}\n",
	})
	t.Setenv("SCELLIS_POLICY_MAX_ROUNDS_PER_DAY", "5")
	t.Setenv("SCELLIS_POLICY_GENERIC_SHARDS", "yes")
	c, err := LoadSilo(filepath.Join(dir, "silo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy.MaxRoundsPerDay != 5 || !c.Policy.GenericShards || c.Policy.MinCohort != MinSites {
		t.Fatalf("policy %+v", c.Policy)
	}
}

// A silo's poll is its heartbeat: a poll not below silo_lease is refused
// at its line, and a longer silo_lease given in the silo config admits it.
func TestLoadSiloPollBelowLease(t *testing.T) {
	base := "name: h\nidentity: i\nfederation: f\ndata_dir: d\ndatasets:\n  cardio: {path: cardio.csv, label: outcome, class: public, budget: {epsilon: 1, delta: 1e-5}}\n"
	dir := writeFiles(t, map[string]string{
		"cardio.csv": cardioCSV,
		"slow.yaml":  base + "poll: 6s\n",
		"long.yaml":  base + "poll: 6s\nsilo_lease: 20s\n",
	})
	_, err := LoadSilo(filepath.Join(dir, "slow.yaml"))
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.InvalidValue || !strings.Contains(ds[0].Error(), "slow.yaml:7:") || !strings.Contains(ds[0].Message, "silo_lease") {
		t.Fatalf("poll 6s with the default lease: %v", err)
	}
	c, err := LoadSilo(filepath.Join(dir, "long.yaml"))
	if err != nil || c.Poll != 6*time.Second || c.SiloLease != 20*time.Second {
		t.Fatalf("poll 6s under silo_lease 20s: %+v %v", c, err)
	}
}

// policy.aggregation lists the modes a silo takes part in; an unknown one
// is refused at its line.
func TestLoadSiloAggregationModes(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []string
		bad  bool
	}{
		{"[threshold-he]", []string{"threshold-he"}, false},
		{"[masking, threshold-he]", []string{"masking", "threshold-he"}, false},
		{"[masking, homomorphic]", nil, true},
	} {
		dir := writeFiles(t, map[string]string{"site/data/cardio.csv": cardioCSV, "abs/registry.csv": "x,y\n1,0\n"})
		file := filepath.Join(dir, "site", "silo.yaml")
		src := strings.ReplaceAll(goodSilo, "/abs/", dir+"/abs/") + "  aggregation: " + tc.list + "\n"
		os.WriteFile(file, []byte(src), 0o644)
		c, err := LoadSilo(file)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "silo.yaml:28:26:") || !strings.Contains(err.Error(), `unknown aggregation mode "homomorphic"`) {
				t.Fatalf("%s: want a refusal at 28:26, got %v", tc.list, err)
			}
			continue
		}
		if err != nil || !slices.Equal(c.Policy.Aggregation, tc.want) {
			t.Fatalf("%s: %v %v", tc.list, err, c.Policy.Aggregation)
		}
	}
}

// policy.secagg_threshold is two-thirds unless the silo says majority; any
// other value is refused at its line.
func TestLoadSiloSecAggThreshold(t *testing.T) {
	for _, tc := range []struct {
		line, want, bad string
	}{
		{"", ThresholdTwoThirds, ""},
		{"  secagg_threshold: majority\n", ThresholdMajority, ""},
		{"  secagg_threshold: two-thirds\n", ThresholdTwoThirds, ""},
		{"  secagg_threshold: half\n", "", `silo.yaml:28:21:`},
	} {
		dir := writeFiles(t, map[string]string{"site/data/cardio.csv": cardioCSV, "abs/registry.csv": "x,y\n1,0\n"})
		file := filepath.Join(dir, "site", "silo.yaml")
		os.WriteFile(file, []byte(strings.ReplaceAll(goodSilo, "/abs/", dir+"/abs/")+tc.line), 0o644)
		c, err := LoadSilo(file)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.Contains(err.Error(), `unknown secure-aggregation threshold "half"`) {
				t.Fatalf("%q: want a refusal at %s, got %v", tc.line, tc.bad, err)
			}
			continue
		}
		if err != nil || c.Policy.SecAggThreshold != tc.want {
			t.Fatalf("%q: %v %q", tc.line, err, c.Policy.SecAggThreshold)
		}
	}
}
