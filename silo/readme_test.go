package silo

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/trust"
)

// readmeBlock returns the fenced yaml block of README.md whose first line
// is "# NAME".
func readmeBlock(t *testing.T, readme, name string) string {
	t.Helper()
	re := regexp.MustCompile("(?s)```yaml\n(# " + regexp.QuoteMeta(name) + "[ \n].*?)```")
	m := re.FindStringSubmatch(readme)
	if m == nil {
		t.Fatalf("README.md has no yaml block starting with # %s", name)
	}
	return m[1]
}

// The README's walkthrough is consistent: its run.yaml, launched at its
// hospital-a.yaml, passes that silo's policy at every step of the run —
// the statistics step, every training round, the final evaluation — and
// the ledger charges for all of them fit the dataset's budget. (Only the
// dataset path and data folder are swapped for this machine's.)
func TestREADMEWalkthroughFitsItsSilo(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	dir := t.TempDir()
	csv := filepath.Join(dir, "patients.csv")
	if err := os.WriteFile(csv, []byte("age,sex,bmi,systolic_bp,glucose,cholesterol,smoker,exercise_hours,prior_admissions,outcome\n60,1,27,130,100,200,0,2,0,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	silo := readmeBlock(t, readme, "hospital-a.yaml")
	silo = regexp.MustCompile(`(?m)^(data_dir:\s*)\S+`).ReplaceAllString(silo, "${1}"+filepath.Join(dir, "data"))
	silo = regexp.MustCompile(`(?m)^(\s*path:\s*)\S+`).ReplaceAllString(silo, "${1}"+csv)
	siloFile := filepath.Join(dir, "hospital-a.yaml")
	if err := os.WriteFile(siloFile, []byte(silo), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadSilo(siloFile)
	if err != nil {
		t.Fatalf("the README's silo config: %v", err)
	}
	spec, err := fl.ParseRunSpec("run.yaml", []byte(readmeBlock(t, readme, "run.yaml")))
	if err != nil {
		t.Fatalf("the README's run.yaml: %v", err)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	canon, id, _, err := spec.Resolve(cat, "")
	if err != nil {
		t.Fatal(err)
	}
	rounds := &MemoryRoundLog{}
	policy, err := NewPolicy(cfg, rounds).Pin(cat)
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	ledger, err := dp.Create(filepath.Join(dir, "ledger"), key, &dp.Options{Silo: "hospital-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	ds, ok := cfg.Dataset(spec.Dataset)
	if !ok {
		t.Fatalf("the README's silo has no dataset %q the run asks for", spec.Dataset)
	}
	if _, err := ledger.DeclareBudget(ds.Name, ds.Budget.Epsilon, ds.Budget.Delta); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for r := range spec.StepCount() {
		step, _ := spec.Step(r)
		req := RoundRequest{Run: string(id), Round: r, StrategyRef: canon.Strategy, StrategyName: canon.Spec.Strategy,
			Dataset: ds.Name, Privacy: spec.StepPrivacy(ds.Unit, step), Cohort: 4, Threshold: 3,
			Regime: trust.Consortium, SecureAgg: spec.SecureAgg, Step: step}
		if problems := policy.CheckRound(req, LedgerOf(ledger), now); problems.HasErrors() {
			t.Fatalf("step %d (%s) of the README's run is refused by its silo:\n%v", r, step, problems)
		}
		mechs, err := req.Mechanisms()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ledger.Charge(dp.ChargeRequest{Dataset: ds.Name, Consumer: Consumer(req.Run, r), Mechanisms: mechs}); err != nil {
			t.Fatalf("step %d (%s): %v", r, step, err)
		}
		rounds.Record(req.Key(), now)
		now = now.Add(2 * time.Hour) // a round every two hours: max_rounds_per_day holds
	}
	if !strings.Contains(readmeBlock(t, readme, "run.yaml"), "feature_bounds") {
		t.Fatal("the README's run uses federated statistics under DP without feature bounds")
	}
}
