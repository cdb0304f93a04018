// Package silo is the silo appliance: the data custodian's side of a
// federation. So far it holds the pure part: the silo's Policy, which
// judges every round request against the site's config, its privacy ledger
// and its round log before the silo does anything else.
//
// Invariant: CheckRound runs every check and returns every violation
// together; a round is accepted only when the list holds no error. It only
// reads: it never charges the ledger nor records the round.
package silo

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
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

// Day is the window max_rounds_per_day counts over: the 24 hours before
// the request, not a calendar day, so rounds cannot bunch around midnight.
const Day = 24 * time.Hour

// Policy is what a silo accepts of a round request: the policy section of
// its config, its datasets, and the round log its daily limit counts.
// Zero limits mean "no limit beyond the ledger"; MinCohort below 3 counts
// as 3. A Policy is read-only once built and safe for concurrent use (its
// RoundLog must be too).
type Policy struct {
	// Strategies lists accepted strategies by catalog name or sha256: ref.
	Strategies         []string
	MaxEpsilonPerRound float64
	MinNoiseMultiplier float64
	MinCohort          int
	MaxRoundsPerDay    int
	GenericShards      bool
	// Aggregation lists the modes the silo takes part in; empty: all.
	Aggregation []string
	// SecAggThreshold is config.ThresholdTwoThirds (also when empty) or
	// config.ThresholdMajority: the lowest pairwise threshold accepted.
	SecAggThreshold string
	// MaxModelParams and MaxRoundMB bound a round's size (0: no bound).
	MaxModelParams int
	MaxRoundMB     int
	Datasets       []config.Dataset
	Rounds         RoundLog
	// Trainers are the trainers the silo runs, by content hash.
	Trainers []config.Trainer

	// pinned binds accepted names to the refs the silo's own catalog
	// gives them (Pin); nil until pinned.
	pinned map[string]content.Ref
}

// NewPolicy builds a silo's policy from its config. rounds may be nil only
// when the config sets no max_rounds_per_day.
func NewPolicy(c *config.Silo, rounds RoundLog) Policy {
	p := c.Policy
	return Policy{
		Strategies:         slices.Clone(p.Strategies),
		MaxEpsilonPerRound: p.MaxEpsilonPerRound,
		MinNoiseMultiplier: p.MinNoiseMultiplier,
		MinCohort:          p.MinCohort,
		MaxRoundsPerDay:    p.MaxRoundsPerDay,
		GenericShards:      p.GenericShards,
		Aggregation:        slices.Clone(p.Aggregation),
		SecAggThreshold:    p.SecAggThreshold,
		MaxModelParams:     p.MaxModelParams,
		MaxRoundMB:         p.MaxRoundMB,
		Datasets:           slices.Clone(c.Datasets),
		Rounds:             rounds,
		Trainers:           slices.Clone(p.Trainers),
	}
}

// Pin binds every strategy the policy accepts by name to the ref that name
// has in the silo's own catalog, and returns the pinned policy. Afterwards
// a round naming an accepted strategy is accepted only if it runs exactly
// that content; without pinning, the name the request gives is trusted.
// A name the catalog does not hold is diag.UnknownContent.
func (p Policy) Pin(c *catalog.Catalog) (Policy, error) {
	var out diag.List
	pinned := map[string]content.Ref{}
	for _, s := range p.Strategies {
		if content.IsRef(s) {
			continue
		}
		e, ok := c.Lookup(s)
		if !ok {
			out = append(out, diag.New(diag.UnknownContent, "policy.strategies", "the silo's catalog has no strategy %q", s).
				WithHelp("add it to the catalog (scellis catalog add FILE), or remove it from the policy"))
			continue
		}
		if e.Kind != catalog.Strategy {
			out = append(out, diag.New(diag.ContentKind, "policy.strategies", "%q is a %s, not a strategy", s, e.Kind).
				WithHelp("list strategies only"))
			continue
		}
		pinned[s] = e.Ref
	}
	if len(out) > 0 {
		return p, out
	}
	p.pinned = pinned
	return p, nil
}

// dataset returns the silo's dataset called name.
func (p Policy) dataset(name string) (config.Dataset, bool) {
	for _, d := range p.Datasets {
		if d.Name == name {
			return d, true
		}
	}
	return config.Dataset{}, false
}

// CheckRound judges req against the policy, the silo's ledger and its
// round log at time now, and returns every violation (empty: accepted):
//
//   - SC9201 the strategy is not accepted;
//   - SC9204 the cohort is below min_cohort, or below 3, or the secure
//     aggregation threshold t is below min_cohort (the sum could then be
//     unmasked with fewer sites than the silo agreed to);
//   - SC9203 σ is below min_noise_multiplier (a round without DP has none);
//   - SC9206 the silo has no such dataset;
//   - SC4004/SC4002/SC4006/SC4007 the trust rules for training
//     (trust.Admit): an unknown regime, a dataset not classed public on an
//     open pool, DP or secure aggregation off in a consortium;
//   - SC9105 invalid privacy parameters, SC9208 a unit of privacy other
//     than the dataset's, SC9209 a cost without a bound;
//   - SC9213 the round's model has more parameters than max_model_params,
//     or the round moves more than max_round_mb;
//   - SC9205 the silo's rounds over the last 24 hours are used up;
//   - SC9202 the round's ε (computed by the accountant at the dataset's δ)
//     exceeds max_epsilon_per_round, or is unbounded because DP is off;
//   - SC9207 the round would overdraw the dataset's budget;
//   - SC9210 (or the ledger's own code) the ledger or round log cannot be
//     read;
//   - SC9502 the round runs a trainer the policy does not list by hash,
//     SC9510 a trainer round under record-level DP.
//
// A dataset's budget is the smaller of the config's and the ledger's (a
// budget lowered in the config binds at once; the ledger's is never
// raised), at the ledger's δ. ledger may be nil for a round without DP.
// CheckRound does not record the round: the silo records it in its
// RoundLog once it takes part.
func (p Policy) CheckRound(req RoundRequest, ledger LedgerView, now time.Time) diag.List {
	var out diag.List
	add := func(ds ...*diag.Diagnostic) { out = append(out, ds...) }
	subject := req.Subject()

	if d := p.checkStrategy(req); d != nil {
		add(d)
	}
	if req.Trainer != "" {
		add(p.checkTrainer(req)...)
	}

	minCohort := max(p.MinCohort, config.MinSites)
	if req.Cohort < minCohort {
		d := diag.New(diag.SiloCohortTooSmall, subject, "the round has %d sites; this silo takes part only with at least %d", req.Cohort, minCohort)
		if req.Cohort < config.MinSites {
			d.WithHelp("secure aggregation needs three sites besides the aggregator: with two, each could learn the other's update from the sum; wait for more sites")
		} else {
			d.WithHelp("the silo's policy sets min_cohort %d; launch the run with a larger cohort", minCohort)
		}
		add(d)
	}
	if req.Threshold > 0 && req.Threshold < minCohort {
		add(diag.New(diag.SiloCohortTooSmall, subject, "the round's secure-aggregation threshold is %d; with it the sum could be unmasked holding only %d sites, and this silo takes part only in sums of at least %d (min_cohort)", req.Threshold, max(req.Threshold, config.MinSites), minCohort).
			WithHelp("launch the run with cohort.min %d or more (the aggregator sets the threshold to at least cohort.min)", minCohort))
	}
	// Against an aggregator that equivocates about dropouts, pairwise
	// masking protects a site from coalitions of fewer than 2t − n sites:
	// below ⌊2n/3⌋+1 that is not even a third of the cohort. (SecAgg+
	// carries its own per-neighbourhood bound, set by its graph.)
	if req.Masking == secagg.Pairwise && req.Threshold > 0 && p.SecAggThreshold != config.ThresholdMajority {
		if need := secagg.ActiveThreshold(req.Cohort); req.Threshold < need {
			add(diag.New(diag.SiloThresholdLow, subject, "the round's secure-aggregation threshold is %d of %d sites; an aggregator that lies about dropouts could then expose a site's input with the help of %d colluding sites, and this silo requires a threshold of at least %d (⌊2n/3⌋+1: fewer than n/3 colluding sites)",
				req.Threshold, req.Cohort, max(0, 2*req.Threshold-req.Cohort), need).
				WithHelp("launch the run from an aggregator that sets the default threshold, or with cohort.min %d or more; a silo that accepts a majority threshold (more dropouts tolerated, an aggregator acting alone stopped only) says policy.secagg_threshold: majority", need))
		}
	}

	dpOn := req.Privacy.Unit != fl.UnitNone
	if p.MinNoiseMultiplier > 0 {
		switch {
		case !dpOn:
			add(diag.New(diag.SiloNoiseTooLow, subject, "the round adds no DP noise; this silo requires a noise multiplier of at least %g", p.MinNoiseMultiplier).
				WithHelp("run with differential privacy (unit record or silo) and σ ≥ %g", p.MinNoiseMultiplier))
		case req.Privacy.Sigma < p.MinNoiseMultiplier:
			add(diag.New(diag.SiloNoiseTooLow, subject, "noise multiplier σ = %g is below this silo's minimum of %g", req.Privacy.Sigma, p.MinNoiseMultiplier).
				WithHelp("raise σ to %g or more (scellis privacy calibrate chooses σ for a target ε)", p.MinNoiseMultiplier))
		}
	}

	if mode := req.Aggregation; len(p.Aggregation) > 0 && mode != "" && !slices.Contains(p.Aggregation, mode) {
		add(diag.New(diag.SiloAggregationMode, subject, "the round forms its sum by %s; this silo's policy allows %s", mode, strings.Join(p.Aggregation, ", ")).
			WithHelp("run with aggregation: %s, or the silo's operator adds %s to policy.aggregation", p.Aggregation[0], mode))
	}

	add(p.checkSize(req)...)

	ds, known := p.dataset(req.Dataset)
	if !known {
		add(p.unknownDataset(subject, req.Dataset))
	}
	if known && dpOn && req.PublicRows && !ds.PublicRows {
		add(diag.New(diag.SiloRowsNotPublic, subject, "the statistics step would release the row count of dataset %q unnoised (privacy.public_rows), and the dataset does not declare its row count public", ds.Name).
			WithHelp("the data owner adds public_rows: true to the dataset if its row count is not secret, or the run drops privacy.public_rows"))
	}

	admit := trust.Request{Subject: subject, Training: true, DP: dpOn, SecureAgg: req.SecureAgg}
	if known {
		admit.Inputs = []trust.Item{{Name: ds.Name, Class: ds.Class}}
	}
	add(trust.Admit(req.Regime, admit)...)

	var mechs []dp.Mechanism
	priced := !dpOn // without DP there is nothing to price
	if dpOn {
		m, err := req.Mechanisms()
		switch {
		case known && ds.Unit != "" && req.Privacy.Unit != ds.Unit:
			// Priced in the wrong unit, the cost would mislead: not priced.
			add(diag.New(diag.SiloUnitMismatch, subject, "the round asks for %s-level DP, but dataset %q is protected at %s level", req.Privacy.Unit, ds.Name, ds.Unit).
				WithHelp("run with privacy unit %q for this dataset", ds.Unit))
		case err != nil:
			for _, d := range asDiags(err, diag.SiloUnpriced, subject, "") {
				c := *d
				c.Subject = subject // the round, not "privacy record"
				add(&c)
			}
		default:
			mechs, priced = m, true
		}
	}

	if p.MaxRoundsPerDay > 0 {
		add(p.checkRoundsPerDay(req, now)...)
	}

	if p.MaxEpsilonPerRound > 0 && !dpOn {
		add(diag.New(diag.SiloEpsilonPerRound, subject, "the round runs without DP, so its ε is unbounded; this silo caps a round at ε = %g", p.MaxEpsilonPerRound).
			WithHelp("run with differential privacy (unit record or silo)"))
	}
	if known && dpOn && priced {
		add(p.checkBudget(req, ds, mechs, ledger)...)
	}
	return out
}

// checkSize refuses a round larger than the policy's bounds: its model's
// parameters, and the bytes it moves through the silo (8 per value: the
// model fetched and the values summed). A round of unknown size (0) is
// not checked.
func (p Policy) checkSize(req RoundRequest) diag.List {
	var out diag.List
	if p.MaxModelParams > 0 && req.ModelParams > p.MaxModelParams {
		smaller := "run a smaller model (model.hidden)"
		if req.Trainer != "" {
			smaller = "run a trainer with a smaller model (its init.npy)"
		}
		out = append(out, diag.New(diag.SiloModelTooLarge, req.Subject(), "the run's model has %d parameters; this silo's policy trains models of at most %d (max_model_params)", req.ModelParams, p.MaxModelParams).
			WithHelp("%s, or the silo's operator raises policy.max_model_params if the site has the memory for it", smaller))
	}
	if mb := float64(req.RoundValues) * 8 / (1 << 20); p.MaxRoundMB > 0 && mb > float64(p.MaxRoundMB) {
		out = append(out, diag.New(diag.SiloModelTooLarge, req.Subject(), "the round moves %.1f MB through this silo (%d values of 8 bytes: the model it fetches and the values it sums); its policy allows %d MB a round (max_round_mb)", mb, req.RoundValues, p.MaxRoundMB).
			WithHelp("run a smaller model, or the silo's operator raises policy.max_round_mb"))
	}
	return out
}

// checkStrategy accepts a request whose strategy ref is listed, or whose
// name is listed (and, once pinned, whose ref is the silo's for that name).
func (p Policy) checkStrategy(req RoundRequest) *diag.Diagnostic {
	var mismatch content.Ref
	for _, s := range p.Strategies {
		if content.IsRef(s) {
			if req.StrategyRef != "" && content.Ref(s) == req.StrategyRef {
				return nil
			}
			continue
		}
		if s != req.StrategyName {
			continue
		}
		want, ok := p.pinned[s]
		if !ok || want == req.StrategyRef {
			return nil
		}
		mismatch = want
	}
	name := req.StrategyName
	if name == "" {
		name = "(unnamed)"
	}
	if mismatch != "" {
		return diag.New(diag.SiloStrategyRefused, req.Subject(), "strategy %s of the run has ref %s, but this silo accepts %s as %s",
			name, req.StrategyRef.Short(), name, mismatch.Short()).
			WithHelp("the run uses other content under an accepted name; list its full ref in policy.strategies if the site accepts it")
	}
	accepted := "none"
	if len(p.Strategies) > 0 {
		accepted = strings.Join(p.Strategies, ", ")
	}
	return diag.New(diag.SiloStrategyRefused, req.Subject(), "strategy %s (%s) is not accepted by this silo's policy", name, req.StrategyRef.Short()).
		WithHelp("the silo accepts: %s; the site adds a strategy to policy.strategies in its config", accepted)
}

func (p Policy) unknownDataset(subject, name string) *diag.Diagnostic {
	names := make([]string, len(p.Datasets))
	for i, d := range p.Datasets {
		names[i] = d.Name
	}
	d := diag.New(diag.SiloUnknownDataset, subject, "this silo holds no dataset %q", name)
	help := "the silo's datasets are: " + strings.Join(names, ", ")
	if len(names) == 0 {
		help = "the silo holds no datasets"
	}
	if s := diag.Suggest(name, names); s != "" {
		help = fmt.Sprintf("did you mean %q? %s", s, help)
	}
	return d.WithHelp("%s", help)
}

// checkRoundsPerDay counts the rounds accepted over the last Day, the
// requested one excepted (a retried request is not a new round).
func (p Policy) checkRoundsPerDay(req RoundRequest, now time.Time) diag.List {
	subject := req.Subject()
	if p.Rounds == nil {
		return diag.List{diag.New(diag.SiloStateUnavailable, subject, "the policy limits rounds per day but the silo keeps no round log").
			WithHelp("this is a bug in the silo: build its Policy with a RoundLog")}
	}
	recs, err := p.Rounds.AcceptedSince(now.Add(-Day))
	if err != nil {
		return diag.List{diag.New(diag.SiloStateUnavailable, subject, "the round log cannot be read: %v", err).
			WithHelp("check the silo's data_dir; the round is refused until the log can be counted")}
	}
	seen := map[RoundKey]bool{req.Key(): true}
	var times []time.Time
	for _, r := range recs {
		if !seen[r.RoundKey] {
			seen[r.RoundKey] = true
			times = append(times, r.At)
		}
	}
	n := len(times)
	if n < p.MaxRoundsPerDay {
		return nil
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	next := times[n-p.MaxRoundsPerDay].Add(Day)
	return diag.List{diag.New(diag.SiloRoundsPerDay, subject, "this silo took part in %d rounds in the last 24 hours; its policy allows %d", n, p.MaxRoundsPerDay).
		WithHelp("the next round fits after %s", next.UTC().Format(time.RFC3339))}
}

// checkBudget prices the round with the accountant on the ledger's curve:
// against max_epsilon_per_round, and against the dataset's budget.
func (p Policy) checkBudget(req RoundRequest, ds config.Dataset, mechs []dp.Mechanism, ledger LedgerView) diag.List {
	subject := req.Subject()
	if ledger == nil {
		return diag.List{diag.New(diag.SiloStateUnavailable, subject, "no privacy ledger to charge dataset %q", ds.Name).
			WithHelp("this is a bug in the silo: a round with DP needs the silo's ledger")}
	}
	var out diag.List
	acct, err := ledger.Account(ds.Name)
	if err != nil {
		out = append(out, asDiags(err, diag.SiloStateUnavailable, subject,
			"the round is refused until the silo can read its ledger; `scellis ledger verify` checks the file")...)
		if p.MaxEpsilonPerRound <= 0 {
			return out
		}
		// Still report the per-round cap, priced at the config's δ.
		acct = Account{
			Status: dp.DatasetStatus{Dataset: ds.Name, Budget: ds.Budget.Epsilon, Delta: ds.Budget.Delta},
			Orders: dp.DefaultOrders(), Conversion: dp.Improved,
		}
		acct.RDP = make([]float64, len(acct.Orders))
		if q, err := acct.Quote(mechs); err == nil && q.Requested > p.MaxEpsilonPerRound {
			out = append(out, p.overCap(subject, ds.Name, q.Requested, acct.Status.Delta))
		}
		return out
	}
	q, err := acct.Quote(mechs)
	if err != nil {
		return append(out, asDiags(err, diag.SiloUnpriced, subject, "check the round's privacy parameters")...)
	}
	if p.MaxEpsilonPerRound > 0 && q.Requested > p.MaxEpsilonPerRound {
		out = append(out, p.overCap(subject, ds.Name, q.Requested, acct.Status.Delta))
	}
	budget, src := acct.Status.Budget, ""
	if ds.Budget.Epsilon > 0 && ds.Budget.Epsilon < budget {
		budget, src = ds.Budget.Epsilon, fmt.Sprintf(" (the config's; the ledger declares ε = %g)", acct.Status.Budget)
	}
	if !(q.Total <= budget) {
		spent := acct.Status.Spent
		out = append(out, diag.New(diag.SiloBudgetOverdraft, subject,
			"the round would overdraw dataset %q: spent ε = %.6g, requested ε = %.6g, remaining ε = %.6g of budget ε = %g%s at δ = %g (composed, the total would be ε = %.6g)",
			ds.Name, spent, q.Requested, math.Max(0, budget-spent), budget, src, acct.Status.Delta, q.Total).
			WithHelp("%s", fitHelp(req, acct, mechs, budget)))
	}
	return out
}

func (p Policy) overCap(subject, dataset string, eps, delta float64) *diag.Diagnostic {
	return diag.New(diag.SiloEpsilonPerRound, subject, "the round costs dataset %q up to ε = %.6g (at δ = %g), above this silo's cap of ε = %g per round",
		dataset, eps, delta, p.MaxEpsilonPerRound).
		WithHelp("add noise (raise σ), take fewer steps or lower q; scellis privacy calibrate chooses σ for a target ε")
}

// fitHelp says how much of the round's mechanism still fits the budget.
func fitHelp(req RoundRequest, acct Account, mechs []dp.Mechanism, budget float64) string {
	const spentAll = "not one more step at this σ and q fits the dataset's remaining budget; more noise may fit one, but a budget is never raised (new data gets a new dataset name)"
	if len(mechs) != 1 {
		return "add noise (raise σ), take fewer steps or lower q"
	}
	m := mechs[0]
	n, err := dp.MaxSteps(acct.Orders, acct.RDP, m.Q, m.Sigma, budget, acct.Status.Delta, acct.Conversion)
	if err != nil {
		return "add noise (raise σ), take fewer steps or lower q"
	}
	if n == 0 {
		return spentAll
	}
	if req.Privacy.Unit == fl.UnitSilo {
		return fmt.Sprintf("at most %d more rounds at σ = %g, q = %g fit in the remaining budget; add noise for more", n, m.Sigma, m.Q)
	}
	return fmt.Sprintf("at most %d DP-SGD steps at σ = %g, q = %g fit in the remaining budget: lower the round's step allowance, or add noise", n, m.Sigma, m.Q)
}

// asDiags turns err into diagnostics, keeping those it carries and giving
// any other error code, subject and help.
func asDiags(err error, code diag.Code, subject, help string) diag.List {
	if ds, ok := diag.As(err); ok {
		return ds
	}
	return diag.List{diag.New(code, subject, "%v", err).WithHelp("%s", help)}
}
