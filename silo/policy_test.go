package silo

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/trust"
)

var (
	now      = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)
	fedavg   = content.Hash([]byte("fedavg source"))
	other    = content.Hash([]byte("another fedavg"))
	userRef  = content.Hash([]byte("fedadam source"))
	roundDP  = fl.Privacy{Unit: fl.UnitRecord, SampleRate: 0.01, Clip: 1, Sigma: 1.1, Steps: 100} // ε ≈ 0.956 at δ = 1e-5
	baseline = []config.Dataset{
		{Name: "cardio", Class: trust.Confidential, Unit: fl.UnitRecord, Budget: config.Budget{Epsilon: 3, Delta: 1e-5}},
		{Name: "registry", Class: trust.Public, Unit: fl.UnitSilo, Budget: config.Budget{Epsilon: 8, Delta: 1e-6}},
	}
)

func basePolicy(rounds RoundLog) Policy {
	return Policy{
		Strategies:         []string{"fedavg", "fedprox", string(userRef)},
		MaxEpsilonPerRound: 2,
		MinNoiseMultiplier: 0.8,
		MinCohort:          4,
		MaxRoundsPerDay:    3,
		Datasets:           slices.Clone(baseline),
		Rounds:             rounds,
	}
}

func baseRequest() RoundRequest {
	return RoundRequest{
		Run: "run-7", Round: 3, StrategyRef: fedavg, StrategyName: "fedavg",
		Dataset: "cardio", Privacy: roundDP, Cohort: 4, Threshold: 4,
		Regime: trust.Consortium, SecureAgg: true,
	}
}

// fakeLedger serves accounts computed with the real accountant: budget and
// δ per dataset, and the charges already made, as mechanisms.
type fakeLedger struct {
	budgets map[string]config.Budget
	charged map[string][]dp.Mechanism
	err     error
}

func (f fakeLedger) Account(name string) (Account, error) {
	if f.err != nil {
		return Account{}, f.err
	}
	b, ok := f.budgets[name]
	if !ok {
		return Account{}, diag.New(diag.LedgerNoBudget, "dataset "+name, "no budget").WithHelp("declare one")
	}
	a := Account{Orders: dp.DefaultOrders(), Conversion: dp.Improved}
	a.RDP = make([]float64, len(a.Orders))
	for _, m := range f.charged[name] {
		r, err := m.RDP(a.Orders)
		if err != nil {
			return Account{}, err
		}
		for i := range r {
			a.RDP[i] += r[i]
		}
	}
	spent := 0.0 // as the ledger reports a dataset without charges
	if len(f.charged[name]) > 0 {
		var err error
		if spent, _, err = dp.Epsilon(a.Orders, a.RDP, b.Delta, a.Conversion); err != nil {
			return Account{}, err
		}
	}
	a.Status = dp.DatasetStatus{Dataset: name, Budget: b.Epsilon, Delta: b.Delta, Spent: spent, Remaining: max(0, b.Epsilon-spent)}
	return a, nil
}

func freshLedger() fakeLedger {
	return fakeLedger{budgets: map[string]config.Budget{"cardio": {Epsilon: 3, Delta: 1e-5}, "registry": {Epsilon: 8, Delta: 1e-6}}}
}

// logWith returns a round log holding n other rounds accepted within the
// last day and one accepted two days ago.
func logWith(n int) *MemoryRoundLog {
	l := &MemoryRoundLog{}
	l.Record(RoundKey{"old-run", 1}, now.Add(-48*time.Hour))
	for i := range n {
		l.Record(RoundKey{"run-other", i}, now.Add(-time.Duration(20-i)*time.Hour))
	}
	return l
}

func codes(ds diag.List) []diag.Code {
	out := make([]diag.Code, len(ds))
	for i, d := range ds {
		out[i] = d.Code
	}
	slices.Sort(out)
	return out
}

// Every refusal, one at a time (each case changes one thing of an accepted
// round), then several together, and the accept cases.
func TestCheckRound(t *testing.T) {
	round := dp.SubsampledGaussian(roundDP.Sigma, roundDP.SampleRate, int64(roundDP.Steps))
	cases := []struct {
		name   string
		policy func(*Policy)
		req    func(*RoundRequest)
		ledger LedgerView
		want   []diag.Code
		msg    []string // substrings of the rendered diagnostics
	}{
		{name: "accepted"},
		{name: "accepted by ref", req: func(r *RoundRequest) { r.StrategyName, r.StrategyRef = "fedadam", userRef }},
		{name: "accepted update-level DP on a public dataset",
			req: func(r *RoundRequest) {
				r.Dataset, r.Privacy = "registry", fl.Privacy{Unit: fl.UnitSilo, Clip: 1, Sigma: 3}
			}},
		{name: "accepted without DP in the own regime with no limits",
			policy: func(p *Policy) { p.MaxEpsilonPerRound, p.MinNoiseMultiplier = 0, 0 },
			req:    func(r *RoundRequest) { r.Regime, r.Privacy, r.SecureAgg = trust.Own, fl.Privacy{}, false },
			ledger: fakeLedger{err: errors.New("must not be read")}},
		{name: "accepted when the request retries a round already counted",
			policy: func(p *Policy) {
				l := logWith(2)
				l.Record(RoundKey{"run-7", 3}, now.Add(-time.Hour))
				p.Rounds = l
			}},
		{name: "strategy not accepted",
			req:  func(r *RoundRequest) { r.StrategyName, r.StrategyRef = "fedsgd", other },
			want: []diag.Code{diag.SiloStrategyRefused},
			msg:  []string{"strategy fedsgd", "the silo accepts: fedavg, fedprox"}},
		{name: "accepted name but other content once pinned",
			policy: func(p *Policy) { p.pinned = map[string]content.Ref{"fedavg": other} },
			want:   []diag.Code{diag.SiloStrategyRefused},
			msg:    []string{"this silo accepts fedavg as " + other.Short()}},
		{name: "epsilon above max_epsilon_per_round",
			policy: func(p *Policy) { p.MaxEpsilonPerRound = 0.5 },
			want:   []diag.Code{diag.SiloEpsilonPerRound},
			msg:    []string{"up to ε = 0.956", "cap of ε = 0.5 per round"}},
		{name: "a statistics step is priced as its own Gaussian release, not as the training",
			policy: func(p *Policy) { p.MaxEpsilonPerRound = 1 },
			req:    func(r *RoundRequest) { r.Step = fl.StepStats },
			want:   []diag.Code{diag.SiloEpsilonPerRound, diag.SiloBudgetOverdraft},
			msg:    []string{"up to ε = 4.2396"}},
		{name: "a public row count the dataset does not declare public",
			req: func(r *RoundRequest) {
				r.Step, r.PublicRows, r.Privacy.Sigma = fl.StepStats, true, 8
			},
			want: []diag.Code{diag.SiloRowsNotPublic},
			msg:  []string{`row count of dataset "cardio" unnoised`, "public_rows: true"}},
		{name: "accepted: a public row count the dataset declares public",
			policy: func(p *Policy) { p.Datasets[0].PublicRows = true },
			req: func(r *RoundRequest) {
				r.Step, r.PublicRows, r.Privacy.Sigma = fl.StepStats, true, 8
			}},
		{name: "model above max_model_params",
			policy: func(p *Policy) { p.MaxModelParams = 50_000 },
			req:    func(r *RoundRequest) { r.ModelParams, r.RoundValues = 90_113, 180_226 },
			want:   []diag.Code{diag.SiloModelTooLarge},
			msg:    []string{"90113 parameters", "at most 50000 (max_model_params)"}},
		{name: "round above max_round_mb",
			policy: func(p *Policy) { p.MaxRoundMB = 1 },
			req:    func(r *RoundRequest) { r.ModelParams, r.RoundValues = 90_113, 180_226 },
			want:   []diag.Code{diag.SiloModelTooLarge},
			msg:    []string{"moves 1.4 MB", "allows 1 MB a round (max_round_mb)"}},
		{name: "accepted: a model within both bounds",
			policy: func(p *Policy) { p.MaxModelParams, p.MaxRoundMB = 90_113, 2 },
			req:    func(r *RoundRequest) { r.ModelParams, r.RoundValues = 90_113, 180_226 }},
		{name: "noise multiplier below min_noise_multiplier",
			policy: func(p *Policy) { p.MinNoiseMultiplier = 1.5 },
			want:   []diag.Code{diag.SiloNoiseTooLow},
			msg:    []string{"σ = 1.1 is below this silo's minimum of 1.5"}},
		{name: "cohort below min_cohort",
			req:  func(r *RoundRequest) { r.Cohort = 3 },
			want: []diag.Code{diag.SiloCohortTooSmall},
			msg:  []string{"the round has 3 sites; this silo takes part only with at least 4", "min_cohort 4"}},
		{name: "secure-aggregation threshold below min_cohort",
			req:  func(r *RoundRequest) { r.Cohort, r.Threshold = 6, 3 },
			want: []diag.Code{diag.SiloCohortTooSmall},
			msg:  []string{"threshold is 3; with it the sum could be unmasked holding only 3 sites", "at least 4 (min_cohort)"}},
		{name: "pairwise threshold below two-thirds of the cohort",
			req:  func(r *RoundRequest) { r.Cohort, r.Threshold, r.Masking = 9, 5, secagg.Pairwise },
			want: []diag.Code{diag.SiloThresholdLow},
			msg:  []string{"threshold is 5 of 9 sites", "help of 1 colluding sites", "at least 7", "secagg_threshold: majority"}},
		{name: "accepted: two-thirds threshold, pairwise",
			req: func(r *RoundRequest) { r.Cohort, r.Threshold, r.Masking = 9, 7, secagg.Pairwise }},
		{name: "accepted: majority threshold by a policy that allows it",
			policy: func(p *Policy) { p.SecAggThreshold = config.ThresholdMajority },
			req:    func(r *RoundRequest) { r.Cohort, r.Threshold, r.Masking = 9, 5, secagg.Pairwise }},
		{name: "accepted: SecAgg+ carries its own bound",
			req: func(r *RoundRequest) { r.Cohort, r.Threshold, r.Masking = 9, 5, secagg.SecAggPlus }},
		{name: "cohort below three even without min_cohort",
			policy: func(p *Policy) { p.MinCohort = 0 },
			req:    func(r *RoundRequest) { r.Cohort = 2 },
			want:   []diag.Code{diag.SiloCohortTooSmall},
			msg:    []string{"at least 3", "with two, each could learn"}},
		{name: "accepted: threshold-he allowed by a policy naming both modes",
			policy: func(p *Policy) { p.Aggregation = []string{"masking", "threshold-he"} },
			req:    func(r *RoundRequest) { r.Aggregation = fl.AggThresholdHE }},
		{name: "aggregation mode refused by the policy",
			policy: func(p *Policy) { p.Aggregation = []string{"masking"} },
			req:    func(r *RoundRequest) { r.Aggregation = fl.AggThresholdHE },
			want:   []diag.Code{diag.SiloAggregationMode},
			msg:    []string{"forms its sum by threshold-he; this silo's policy allows masking"}},
		{name: "rounds per day used up",
			policy: func(p *Policy) { p.Rounds = logWith(3) },
			want:   []diag.Code{diag.SiloRoundsPerDay},
			msg:    []string{"3 rounds in the last 24 hours; its policy allows 3", "after 2026-03-14T16:00:00Z"}},
		{name: "round log unreadable",
			policy: func(p *Policy) { p.Rounds = brokenLog{} },
			want:   []diag.Code{diag.SiloStateUnavailable}},
		{name: "unknown dataset",
			req:  func(r *RoundRequest) { r.Dataset = "cardoi" },
			want: []diag.Code{diag.SiloUnknownDataset},
			msg:  []string{`no dataset "cardoi"`, `did you mean "cardio"?`}},
		{name: "round would overdraw the budget",
			ledger: fakeLedger{
				budgets: map[string]config.Budget{"cardio": {Epsilon: 1, Delta: 1e-5}},
				charged: map[string][]dp.Mechanism{"cardio": {round}},
			},
			want: []diag.Code{diag.SiloBudgetOverdraft},
			msg:  []string{"spent ε = 0.956091, requested ε = 0.956091, remaining ε = 0.0439089 of budget ε = 1 at δ = 1e-05 (composed, the total would be ε = 1.05774)", "DP-SGD steps"}},
		{name: "budget lowered in the config binds",
			policy: func(p *Policy) { p.Datasets[0].Budget.Epsilon = 0.9 },
			want:   []diag.Code{diag.SiloBudgetOverdraft},
			msg:    []string{"budget ε = 0.9 (the config's; the ledger declares ε = 3)"}},
		{name: "dataset without a budget in the ledger",
			ledger: fakeLedger{budgets: map[string]config.Budget{}},
			want:   []diag.Code{diag.LedgerNoBudget}},
		{name: "ledger unreadable",
			policy: func(p *Policy) { p.MaxEpsilonPerRound = 0.5 },
			ledger: fakeLedger{err: errors.New("disk on fire")},
			want:   []diag.Code{diag.SiloEpsilonPerRound, diag.SiloStateUnavailable},
			msg:    []string{"disk on fire"}},
		{name: "DP off in a consortium",
			policy: func(p *Policy) { p.MaxEpsilonPerRound, p.MinNoiseMultiplier = 0, 0 },
			req:    func(r *RoundRequest) { r.Privacy = fl.Privacy{} },
			want:   []diag.Code{diag.ConsortiumNoDP}},
		{name: "DP off under a per-round cap and a noise minimum",
			req:  func(r *RoundRequest) { r.Regime, r.Privacy = trust.Own, fl.Privacy{} },
			want: []diag.Code{diag.SiloNoiseTooLow, diag.SiloEpsilonPerRound},
			msg:  []string{"adds no DP noise", "ε is unbounded"}},
		{name: "secure aggregation off in a consortium",
			req:  func(r *RoundRequest) { r.SecureAgg = false },
			want: []diag.Code{diag.ConsortiumNoSecAgg}},
		{name: "confidential dataset on an open pool",
			req:  func(r *RoundRequest) { r.Regime = trust.Open },
			want: []diag.Code{diag.OpenNonPublicInput},
			msg:  []string{`input "cardio" is classed confidential`}},
		{name: "unknown regime",
			req:  func(r *RoundRequest) { r.Regime = "" },
			want: []diag.Code{diag.UnknownRegime}},
		{name: "unit of privacy differs from the dataset's",
			req:  func(r *RoundRequest) { r.Privacy.Unit, r.Privacy.SampleRate = fl.UnitSilo, 1 },
			want: []diag.Code{diag.SiloUnitMismatch},
			msg:  []string{"asks for silo-level DP, but dataset \"cardio\" is protected at record level"}},
		{name: "record-level DP without a step allowance",
			req:  func(r *RoundRequest) { r.Privacy.Steps = 0 },
			want: []diag.Code{diag.SiloUnpriced}},
		{name: "invalid privacy parameters",
			req:  func(r *RoundRequest) { r.Privacy.SampleRate = 2 },
			want: []diag.Code{diag.FLBadPrivacy}},
		{name: "every violation together",
			policy: func(p *Policy) { p.Rounds = logWith(5); p.MaxEpsilonPerRound = 0.1 },
			req: func(r *RoundRequest) {
				r.StrategyName, r.StrategyRef = "krum", other
				r.Cohort = 2
				r.Privacy.Sigma = 0.7
				r.Regime = trust.Open
			},
			ledger: fakeLedger{budgets: map[string]config.Budget{"cardio": {Epsilon: 1, Delta: 1e-5}}},
			want: []diag.Code{diag.OpenNonPublicInput, diag.SiloStrategyRefused, diag.SiloEpsilonPerRound,
				diag.SiloNoiseTooLow, diag.SiloCohortTooSmall, diag.SiloRoundsPerDay, diag.SiloBudgetOverdraft}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := basePolicy(logWith(2))
			if tc.policy != nil {
				tc.policy(&p)
			}
			req := baseRequest()
			if tc.req != nil {
				tc.req(&req)
			}
			ledger := tc.ledger
			if ledger == nil {
				ledger = freshLedger()
			}
			got := p.CheckRound(req, ledger, now)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(codes(got), want) {
				t.Fatalf("codes %v, want %v:\n%v", codes(got), want, got)
			}
			if got.HasErrors() != (len(want) > 0) {
				t.Fatalf("HasErrors = %v with %d codes", got.HasErrors(), len(want))
			}
			for _, d := range got {
				if d.Subject != "run run-7 round 3" && d.Code != diag.LedgerNoBudget {
					t.Errorf("%s: subject %q, want the round", d.Code, d.Subject)
				}
				if d.Help == "" {
					t.Errorf("%s has no help: %v", d.Code, d)
				}
			}
			text := got.Error()
			for _, m := range tc.msg {
				if !strings.Contains(text, m) {
					t.Errorf("diagnostics lack %q:\n%s", m, text)
				}
			}
		})
	}
}

type brokenLog struct{}

func (brokenLog) AcceptedSince(time.Time) ([]RoundRecord, error) { return nil, errors.New("log gone") }

// The policy's ε is the accountant's, charged at the ledger's δ: the check
// agrees with dp.Ledger.Charge on a real ledger, round after round, up to
// the round that would overdraw (refused by both, at the same round).
func TestCheckRoundAgreesWithLedger(t *testing.T) {
	dir := t.TempDir()
	_, key, err := generateKey()
	if err != nil {
		t.Fatal(err)
	}
	l, err := dp.Create(filepath.Join(dir, "privacy.ledger"), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.DeclareBudget("cardio", 2, 1e-5); err != nil {
		t.Fatal(err)
	}
	p := basePolicy(nil)
	p.MaxRoundsPerDay = 0
	view := LedgerOf(l)
	mechs, err := baseRequest().Mechanisms()
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for round := 0; round < 50; round++ {
		req := baseRequest()
		req.Round = round
		refusal := p.CheckRound(req, view, now)
		acct, err := view.Account("cardio")
		if err != nil {
			t.Fatal(err)
		}
		q, err := acct.Quote(mechs)
		if err != nil {
			t.Fatal(err)
		}
		e, err := l.Charge(dp.ChargeRequest{Dataset: "cardio", Consumer: fmt.Sprintf("run-7/%d", round), Mechanisms: mechs})
		if (err == nil) != (len(refusal) == 0) {
			t.Fatalf("round %d: policy says %v, ledger says %v", round, refusal, err)
		}
		if err != nil {
			if !slices.Equal(codes(refusal), []diag.Code{diag.SiloBudgetOverdraft}) {
				t.Fatalf("round %d: refused with %v", round, refusal)
			}
			break
		}
		accepted++
		if e.Charge.Epsilon != q.Requested || e.Charge.Cumulative != q.Total {
			t.Fatalf("round %d: quote (%v, %v), ledger charged (%v, %v)", round, q.Requested, q.Total, e.Charge.Epsilon, e.Charge.Cumulative)
		}
	}
	if accepted < 2 || accepted >= 50 {
		t.Fatalf("%d rounds accepted; want the budget to run out after a few", accepted)
	}
	// A snapshot read without the key gives the same account.
	s, err := dp.Verify(l.Path(), l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := LedgerOf(l).Account("cardio")
	a2, err := SnapshotView(s).Account("cardio")
	if err != nil || !slices.Equal(a1.RDP, a2.RDP) || a1.Status != a2.Status {
		t.Fatalf("snapshot view differs: %v", err)
	}
	if _, err := SnapshotView(s).Account("nope"); !isCode(err, diag.LedgerNoBudget) {
		t.Fatalf("unknown dataset: %v", err)
	}
}

func isCode(err error, c diag.Code) bool {
	ds, ok := diag.As(err)
	return ok && len(ds) == 1 && ds[0].Code == c
}

func TestMechanisms(t *testing.T) {
	r := baseRequest()
	ms, err := r.Mechanisms()
	if err != nil || len(ms) != 1 || ms[0] != dp.SubsampledGaussian(1.1, 0.01, 100) {
		t.Fatalf("record: %v %v", ms, err)
	}
	r.Privacy = fl.Privacy{Unit: fl.UnitSilo, Clip: 1, Sigma: 2}
	ms, err = r.Mechanisms()
	if err != nil || len(ms) != 1 || ms[0] != dp.SubsampledGaussian(2, 1, 1) {
		t.Fatalf("silo, q=0 means 1: %v %v", ms, err)
	}
	// A silo's participation is public: no sampling hides it, so a q (or
	// a participation rate) below 1 would undercharge; it is refused, and
	// the diagnostic names the field.
	r.Privacy.SampleRate = 1e-6
	if _, err = r.Mechanisms(); !isCode(err, diag.FLBadPrivacy) || !strings.Contains(err.Error(), "privacy.q = 1e-06") {
		t.Fatalf("silo q = 1e-6: %v", err)
	}
	r.Privacy.SampleRate, r.Privacy.Participation = 1, 0.5
	if _, err = r.Mechanisms(); !isCode(err, diag.FLBadPrivacy) || !strings.Contains(err.Error(), "privacy.participation = 0.5") {
		t.Fatalf("silo participation 0.5: %v", err)
	}
	r.Privacy.Participation = 1
	if ms, _ = r.Mechanisms(); ms[0] != dp.SubsampledGaussian(2, 1, 1) {
		t.Fatalf("silo q = 1: %v", ms)
	}
	r.Privacy = fl.Privacy{}
	if ms, err = r.Mechanisms(); ms != nil || err != nil {
		t.Fatalf("no DP: %v %v", ms, err)
	}
	r.Privacy = fl.Privacy{Unit: fl.UnitRecord, SampleRate: 0.1, Clip: 1, Sigma: 1}
	if _, err = r.Mechanisms(); !isCode(err, diag.SiloUnpriced) {
		t.Fatalf("no step allowance: %v", err)
	}
	// Statistics and evaluation steps release one Gaussian sum (q = 1),
	// whatever the training's sampling and steps.
	for _, step := range []string{fl.StepStats, fl.StepEval} {
		r.Step, r.Privacy = step, fl.Privacy{Unit: fl.UnitRecord, SampleRate: 0.01, Clip: 1, Sigma: 5, Steps: 100}
		if ms, err = r.Mechanisms(); err != nil || len(ms) != 1 || ms[0] != dp.SubsampledGaussian(5, 1, 1) {
			t.Fatalf("%s step: %v %v", step, ms, err)
		}
	}
}

func TestMemoryRoundLog(t *testing.T) {
	var l MemoryRoundLog
	k := RoundKey{"r", 1}
	l.Record(k, now.Add(-2*time.Hour))
	l.Record(k, now) // a round is recorded once, at its first time
	l.Record(RoundKey{"r", 2}, now.Add(-30*time.Hour))
	got, err := l.AcceptedSince(now.Add(-Day))
	if err != nil || len(got) != 1 || got[0].RoundKey != k || !got[0].At.Equal(now.Add(-2*time.Hour)) {
		t.Fatalf("AcceptedSince: %v %v", got, err)
	}
	l.Forget(now.Add(-Day))
	if all, _ := l.AcceptedSince(time.Time{}); len(all) != 1 {
		t.Fatalf("after Forget: %v", all)
	}
}

// NewPolicy carries a loaded config over; Pin binds names to the silo's
// catalog.
func TestNewPolicyAndPin(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cardio.csv"), []byte("age,outcome\n1,0\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "silo.yaml"), []byte(`name: h
identity: id.key
federation: fed.yaml
data_dir: state
datasets:
  cardio: {path: cardio.csv, label: outcome, class: confidential, budget: {epsilon: 3, delta: 1e-5}}
policy:
  strategies: [fedavg, fedprox]
  min_cohort: 5
  max_rounds_per_day: 2
`), 0o644)
	c, err := config.LoadSilo(filepath.Join(dir, "silo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := NewPolicy(c, &MemoryRoundLog{})
	if p.MinCohort != 5 || p.MaxRoundsPerDay != 2 || len(p.Datasets) != 1 || !slices.Equal(p.Strategies, []string{"fedavg", "fedprox"}) {
		t.Fatalf("policy %+v", p)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := p.Pin(cat)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := cat.Lookup("fedavg")
	req := baseRequest()
	req.Cohort, req.Threshold = 5, 5
	req.StrategyRef = e.Ref
	if got := pinned.CheckRound(req, freshLedger(), now); len(got) != 0 {
		t.Fatalf("the silo's own fedavg refused: %v", got)
	}
	req.StrategyRef = other
	if got := pinned.CheckRound(req, freshLedger(), now); !slices.Equal(codes(got), []diag.Code{diag.SiloStrategyRefused}) {
		t.Fatalf("other content named fedavg: %v", got)
	}
	p.Strategies = []string{"fedavg", "no-such-strategy", "mean"}
	if _, err := p.Pin(cat); err == nil || !strings.Contains(err.Error(), "no-such-strategy") || !strings.Contains(err.Error(), `"mean" is a reducer`) {
		t.Fatalf("Pin with unknown names: %v", err)
	}
}

func generateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) { return ed25519.GenerateKey(nil) }
