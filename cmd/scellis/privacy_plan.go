package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/job"
)

// planShares are the statistics shares privacy plan simulates when it has
// data to simulate on: the ε the statistics release may spend alone, as a
// share of the run's ε. defaultStatsShare is the one it gives without data:
// the share that did best or within noise of the best across the study in
// docs/dp.md ("Planning a whole run").
var planShares = []float64{0.06, 0.1, 0.15, 0.25, 0.4, 0.55}

const (
	defaultStatsShare = 0.25
	defaultEvalShare  = 0.1
	defaultRepeats    = 4
)

func newPrivacyPlanCmd() *cobra.Command {
	var eps, roundEps, delta, rows, rounds, statsShare, evalShare, data, evalData, label, out, unit string
	var repeats int
	var af accountingFlags
	c := &cobra.Command{
		Use:   "plan [RUN.yaml] --epsilon E --delta D [--data DIR | --rows N --rounds R]",
		Short: "Plan a whole run's DP within a budget: statistics, training and evaluation, the split picked by simulation",
		Long: `Plan the privacy parameters of a whole federated run so that it spends at
most ε (composed over the run, at δ) and at most --round-epsilon in any one
step alone: the statistics step's release (privacy.sums_sigma), every
training round (record-level DP-SGD: σ, q and steps per round; update level
with --unit silo: σ) and every evaluation step (privacy.eval_sigma; the
final one, and one every evaluation.every rounds). Each step is priced as a
silo's ledger charges it, with the parameters as printed, so the run given
these settings completes all its steps within a budget of ε.

The split: evaluation gets --eval-share of ε (it only reports on the
model). The statistics step gets the share that gives the best model: with
RUN.yaml and --data DIR (one CSV per site, as fl simulate reads them —
public or synthetic data shaped like the silos'), each share in ` + sharesText() + `
is simulated --repeats times and the one with the lowest held-out loss is
picked; without them, ` + fmt.Sprint(defaultStatsShare) + `, the share the study in docs/dp.md found
best or within noise of it. --stats-share fixes it.

Without RUN.yaml the plan is for the default run: a statistics step and
--rounds training rounds over silos of --rows records, no evaluation.
--out FILE writes RUN.yaml with the planned settings (strategy params.steps
set to the planned DP-SGD steps per round).`,
		Args: cobra.MaximumNArgs(1),
		Example: `  scellis privacy plan run.yaml --epsilon 4 --delta 1e-5 --data sites --out run-planned.yaml
  scellis privacy plan --epsilon 6 --delta 1e-5 --rows 800 --rounds 6`,
		RunE: func(cmd *cobra.Command, args []string) error {
			pl := &planner{unit: fl.Unit(unit), repeats: repeats, evalShare: defaultEvalShare}
			var err error
			if pl.eps, err = requireFloat(cmd, "epsilon", eps, diag.DPBadEpsilon); err != nil {
				return err
			}
			if pl.delta, err = requireFloat(cmd, "delta", delta, diag.DPBadDelta); err != nil {
				return err
			}
			if v, d := parseNumber("round-epsilon", roundEps, diag.DPBadEpsilon); d != nil {
				return d
			} else {
				pl.roundEps = v
			}
			if pl.orders, pl.conv, err = af.parse(); err != nil {
				return err
			}
			if pl.unit != fl.UnitRecord && pl.unit != fl.UnitSilo {
				return usageError{fmt.Errorf("--unit %q: give record (DP-SGD per example) or silo (the whole update)", unit)}
			}
			if cmd.Flags().Changed("eval-share") {
				if pl.evalShare, err = parseShare("eval-share", evalShare); err != nil {
					return err
				}
			}
			shares := []float64{defaultStatsShare}
			if cmd.Flags().Changed("stats-share") {
				s, err := parseShare("stats-share", statsShare)
				if err != nil {
					return err
				}
				shares = []float64{s}
			}
			if len(args) == 1 {
				if cmd.Flags().Changed("rounds") {
					return usageError{fmt.Errorf("the run file sets the rounds; drop --rounds")}
				}
				if err := pl.loadRun(args[0], data, evalData, label); err != nil {
					return err
				}
				if pl.sites != nil && !cmd.Flags().Changed("stats-share") {
					shares = planShares
				}
			} else {
				if data != "" || out != "" {
					return usageError{fmt.Errorf("--data and --out need the run file: scellis privacy plan RUN.yaml …")}
				}
				r, err := requireCount(cmd, "rounds", rounds)
				if err != nil {
					return err
				}
				pl.spec = &fl.RunSpec{Name: "plan", Rounds: int(r), DP: true, Clip: 1, Params: map[string]any{}}
			}
			if cmd.Flags().Changed("rows") {
				n, err := requireCount(cmd, "rows", rows)
				if err != nil {
					return err
				}
				pl.rows = int(n)
			}
			if pl.rows == 0 && pl.unit == fl.UnitRecord {
				return usageError{fmt.Errorf("give the records per silo with --rows N, or the sites' data with --data DIR")}
			}
			choices, best, err := pl.plan(cmd.Context(), shares)
			if err != nil {
				return err
			}
			if out != "" {
				if err := pl.writeRun(out, choices[best]); err != nil {
					return err
				}
			}
			w := cmd.OutOrStdout()
			if jsonOutput {
				return writeJSON(w, planOutput{Epsilon: pl.eps, Delta: pl.delta, RoundEpsilon: pl.roundEps, Unit: string(pl.unit),
					Steps: pl.describeSteps(), Candidates: choices, Chosen: best, Out: out})
			}
			pl.print(w, choices, best, out)
			return nil
		},
	}
	c.Flags().StringVar(&eps, "epsilon", "", "ε for the whole run (required)")
	c.Flags().StringVar(&roundEps, "round-epsilon", "1", "most ε any one step may spend alone (a silo's max_epsilon_per_round)")
	c.Flags().StringVar(&delta, "delta", "", "δ, in (0, 1), well below 1/rows (required)")
	c.Flags().StringVar(&rows, "rows", "", "training records per silo (default with --data: the smallest site's)")
	c.Flags().StringVar(&rounds, "rounds", "", "training rounds, without a run file")
	c.Flags().StringVar(&unit, "unit", string(fl.UnitRecord), "the silos' unit of privacy: record (DP-SGD) or silo (the whole update)")
	c.Flags().StringVar(&statsShare, "stats-share", "", "share of ε for the statistics release alone, in (0, 1) (default: simulated with --data, else "+fmt.Sprint(defaultStatsShare)+")")
	c.Flags().StringVar(&evalShare, "eval-share", fmt.Sprint(defaultEvalShare), "share of ε for all evaluation releases together")
	c.Flags().StringVar(&data, "data", "", "folder of site CSVs to simulate the shares on (one per site, as fl simulate)")
	c.Flags().StringVar(&evalData, "eval-data", "", "folder of the sites' evaluation CSVs (for evaluation: {dataset: …})")
	c.Flags().StringVar(&label, "label", "", "label column (default: the run's model.label)")
	c.Flags().IntVar(&repeats, "repeats", defaultRepeats, "simulations per share (DP noise differs in each)")
	flagRange(c, "repeats", "1", "100")
	c.Flags().StringVar(&out, "out", "", "write the run file with the planned settings here")
	af.register(c)
	return c
}

func sharesText() string {
	s := make([]string, len(planShares))
	for i, v := range planShares {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

// parseShare parses a share of ε in (0, 1).
func parseShare(name, s string) (float64, error) {
	v, d := parseNumber(name, s, diag.DPBadEpsilon)
	if d != nil {
		return 0, d
	}
	if !(v > 0 && v < 1) {
		return 0, diag.New(diag.DPBadEpsilon, name, "--%s %g: a share of ε lies in (0, 1)", name, v).
			WithHelp("for example --%s 0.1", name)
	}
	return v, nil
}

// planner plans one run: its spec, the budget, and the sites to simulate.
type planner struct {
	spec                 *fl.RunSpec
	file                 string
	src                  []byte
	cat                  *catalog.Catalog
	sites                *sites
	unit                 fl.Unit
	eps, roundEps, delta float64
	evalShare            float64
	rows                 int
	repeats              int
	orders               []float64
	conv                 dp.Conversion
}

// planChoice is the run's DP at one statistics share.
type planChoice struct {
	StatsShare float64 `json:"statistics_share"`
	SumsSigma  float64 `json:"sums_sigma,omitempty"`
	EvalSigma  float64 `json:"eval_sigma,omitempty"`
	Sigma      float64 `json:"sigma"`
	Q          float64 `json:"q,omitempty"`
	Batch      int     `json:"batch,omitempty"`
	Steps      int     `json:"steps,omitempty"`
	// Epsilon is the whole run composed, priced as a silo's ledger
	// charges it with the parameters as printed; RoundEpsilon the
	// costliest step alone.
	Epsilon      float64    `json:"epsilon"`
	RoundEpsilon float64    `json:"round_epsilon"`
	Simulated    *planScore `json:"simulated,omitempty"`
	spec         *fl.RunSpec
}

// planScore is a share's simulated model: the mean loss per row of the
// final model on the sites' held-out rows (their training rows when the run
// holds none out), over Runs simulations.
type planScore struct {
	Loss float64 `json:"loss"`
	SD   float64 `json:"sd"`
	Runs int     `json:"runs"`
	On   string  `json:"on"`
}

type planOutput struct {
	Epsilon      float64      `json:"epsilon"`
	Delta        float64      `json:"delta"`
	RoundEpsilon float64      `json:"round_epsilon"`
	Unit         string       `json:"unit"`
	Steps        string       `json:"steps"`
	Candidates   []planChoice `json:"candidates"`
	Chosen       int          `json:"chosen"`
	Out          string       `json:"out,omitempty"`
}

// loadRun reads the run file and, with --data, the sites.
func (pl *planner) loadRun(file, data, evalData, label string) error {
	var err error
	if pl.src, err = os.ReadFile(file); err != nil {
		return diag.New(diag.FileUnreadable, "run", "cannot read %s: %v", file, err)
	}
	if pl.spec, err = fl.ParseRunSpec(file, pl.src); err != nil {
		return err
	}
	if !pl.spec.DP {
		return diag.New(diag.InvalidValue, "run "+pl.spec.Name, "the run has DP off (privacy.dp: false): there is nothing to plan").
			WithHelp("plan a run with DP on, or run this one in an own pool as it is")
	}
	if pl.spec.Trainer != "" {
		// A trainer's update is released at the silo level only
		// (docs/trainers.md), and fl simulate does not run trainers.
		if pl.unit != fl.UnitSilo {
			return diag.New(diag.InvalidValue, "run "+pl.spec.Name, "the run names trainer %s, whose update the silos release at the silo level only", pl.spec.Trainer).
				WithHelp("plan it with --unit silo")
		}
		if data != "" {
			return usageError{fmt.Errorf("--data simulates the run with the built-in models; this run names trainer %s: plan it without --data", pl.spec.Trainer)}
		}
	}
	pl.file = file
	if pl.cat, err = openCatalog(); err != nil {
		return err
	}
	if data == "" {
		return nil
	}
	if pl.sites, err = readSites(pl.spec, data, evalData, label); err != nil {
		return err
	}
	sim := &flSim{sites: pl.sites}
	if err := sim.resolve(pl.spec, pl.cat, file); err != nil {
		return err
	}
	trains, _, err := sim.siteData(fl.StepStats) // the training rows, before standardisation
	if err != nil {
		return err
	}
	pl.rows = math.MaxInt
	for _, t := range trains {
		pl.rows = min(pl.rows, t.Rows())
	}
	return nil
}

// plan prices the run at every share, simulates them when it has sites,
// and returns the choices and the index of the best.
func (pl *planner) plan(ctx context.Context, shares []float64) ([]planChoice, int, error) {
	if pl.spec.StandardizeMode() != fl.StandardizeFederated {
		shares = []float64{0} // no statistics step
	}
	var out []planChoice
	var unreachable error
	for _, s := range shares {
		c, err := pl.price(s)
		if ds, ok := diag.As(err); ok && ds[0].Code == diag.DPUnreachable {
			unreachable = err // a share that leaves the training no budget
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		if k := len(out); k > 0 && out[k-1].SumsSigma == c.SumsSigma {
			continue // shares below the least ε of a release are that one
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, 0, unreachable
	}
	best := 0
	if pl.sites == nil || len(out) == 1 {
		return out, best, nil
	}
	for i := range out {
		sc, err := pl.simulate(ctx, out[i].spec)
		if err != nil {
			return nil, 0, err
		}
		out[i].Simulated = &sc
		if sc.Loss < out[best].Simulated.Loss {
			best = i
		}
	}
	return out, best, nil
}

// price plans the run's DP with the statistics release alone at
// share·ε: the evaluations at evalShare·ε together, the training at the
// least noise that keeps the whole run within ε, every step within
// roundEps; then prices the run as the silos will charge it.
func (pl *planner) price(share float64) (planChoice, error) {
	spec := *pl.spec
	spec.DP, spec.Params = true, maps.Clone(spec.Params)
	if spec.Params == nil {
		spec.Params = map[string]any{}
	}
	c := planChoice{StatsShare: share}
	base := make([]float64, len(pl.ordersOrDefault()))
	add := func(sigma float64, n int) error {
		r, err := dp.SubsampledGaussian(sigma, 1, int64(n)).RDP(pl.ordersOrDefault())
		for i, v := range r {
			base[i] += v
		}
		return err
	}
	gaussian := func(eps float64, n int) (float64, error) {
		a, err := dp.Calibrate(eps, pl.delta, 1, int64(n), pl.orders, pl.conv)
		if err != nil {
			return 0, err
		}
		b, err := dp.Calibrate(pl.roundEps, pl.delta, 1, 1, pl.orders, pl.conv)
		return ceil3(math.Max(a, b)), err
	}
	if share > 0 {
		// At least what one release can claim at all: the order grid
		// bounds the least ε of a Gaussian release (about 0.11 at
		// δ = 1e-5 with the default orders).
		least, err := pl.leastEpsilon(1)
		if err != nil {
			return c, err
		}
		// Within the least a release can claim and the per-step cap.
		c.StatsShare = min(max(share, least/pl.eps), pl.roundEps/pl.eps)
		if c.SumsSigma, err = gaussian(c.StatsShare*pl.eps, 1); err != nil {
			return c, err
		}
		spec.SumsSigma = c.SumsSigma
		if err := add(c.SumsSigma, 1); err != nil {
			return c, err
		}
	}
	if n := pl.evaluations(); n > 0 {
		least, err := pl.leastEpsilon(n) // as for the statistics
		if err != nil {
			return c, err
		}
		if c.EvalSigma, err = gaussian(max(pl.evalShare*pl.eps, least), n); err != nil {
			return c, err
		}
		spec.EvalSigma = c.EvalSigma
		if err := add(c.EvalSigma, n); err != nil {
			return c, err
		}
	}
	if err := pl.planTraining(&spec, &c, base); err != nil {
		return c, err
	}
	c.spec = &spec
	return c, pl.check(&c)
}

// planTraining sets the training rounds' DP: DP-SGD's σ, q and steps at
// record level (dp.PlanDPSGDAfter), σ at silo level, composed with base.
func (pl *planner) planTraining(spec *fl.RunSpec, c *planChoice, base []float64) error {
	if pl.unit == fl.UnitSilo {
		a, err := dp.CalibrateAfter(pl.eps, pl.delta, 1, int64(spec.Rounds), base, pl.orders, pl.conv)
		if err != nil {
			return err
		}
		b, err := dp.Calibrate(pl.roundEps, pl.delta, 1, 1, pl.orders, pl.conv)
		if err != nil {
			return err
		}
		c.Sigma = ceil3(math.Max(a, b))
		spec.Sigma, spec.Q, spec.Steps = c.Sigma, 0, 0
		if spec.Clip == 0 {
			spec.Clip = 1
		}
		return nil
	}
	p, err := dp.PlanDPSGDAfter(pl.eps, pl.roundEps, pl.delta, pl.rows, spec.Rounds, base, pl.orders, pl.conv)
	if err != nil {
		return err
	}
	c.Sigma, c.Q, c.Batch, c.Steps = ceil3(p.Sigma), floor6(p.Q), p.Batch, p.StepsPerRound
	spec.Sigma, spec.Q, spec.Steps = c.Sigma, c.Q, c.Steps
	if spec.Clip == 0 {
		spec.Clip = 1
	}
	// One model.train of that many DP-SGD steps per round.
	delete(spec.Params, "epochs")
	spec.Params["steps"] = int64(c.Steps)
	return nil
}

// check prices the planned run as its silos' ledgers will charge it
// (fl.RunSpec.RunCharges) and refuses a plan beyond the budget: the
// rounded parameters must not spend more than the plan.
func (pl *planner) check(c *planChoice) error {
	mechs, err := c.spec.RunCharges(pl.unit)
	if err != nil {
		return err
	}
	acc, err := dp.NewAccountant(pl.ordersOrDefault())
	if err != nil {
		return err
	}
	for _, m := range mechs {
		if err := acc.Compose(m); err != nil {
			return err
		}
		one, err := dp.NewAccountant(pl.ordersOrDefault())
		if err != nil {
			return err
		}
		if err := one.Compose(m); err != nil {
			return err
		}
		e, _, err := one.Epsilon(pl.delta, pl.conv)
		if err != nil {
			return err
		}
		c.RoundEpsilon = math.Max(c.RoundEpsilon, e)
	}
	if c.Epsilon, _, err = acc.Epsilon(pl.delta, pl.conv); err != nil {
		return err
	}
	if c.Epsilon > pl.eps*(1+1e-9) || c.RoundEpsilon > pl.roundEps*(1+1e-9) {
		panic(fmt.Sprintf("privacy plan: planned run spends ε = %v (a step %v) of %v (%v)", c.Epsilon, c.RoundEpsilon, pl.eps, pl.roundEps))
	}
	return nil
}

// leastEpsilon is the least ε the plan gives n Gaussian releases: a
// quarter above the least they can claim on the accountant's orders at δ
// (that of σ = 10⁶; no target below it can be met, and just above it
// the curve is so flat that σ runs into the hundreds for nothing: at
// 1.25 times it, one release at δ = 1e-5 has σ ≈ 33).
func (pl *planner) leastEpsilon(n int) (float64, error) {
	orders := pl.ordersOrDefault()
	r, err := dp.SubsampledGaussian(1e6, 1, int64(n)).RDP(orders)
	if err != nil {
		return 0, err
	}
	e, _, err := dp.Epsilon(orders, r, pl.delta, pl.conv)
	return 1.25 * e, err
}

func (pl *planner) ordersOrDefault() []float64 {
	if pl.orders == nil {
		return dp.DefaultOrders()
	}
	return pl.orders
}

// evaluations is the number of evaluation steps of the run.
func (pl *planner) evaluations() int {
	if !pl.spec.Eval.On() {
		return 0
	}
	return 1 + pl.spec.MidEvals()
}

// simulate runs the planned spec over the sites pl.repeats times, each
// with other training seeds (and fresh DP noise), and scores the final
// models without noise.
func (pl *planner) simulate(ctx context.Context, spec *fl.RunSpec) (planScore, error) {
	var losses []float64
	sc := planScore{On: "held-out rows"}
	for rep := range pl.repeats {
		s := *spec
		s.Seed = spec.Seed + int64(rep)
		sim := &flSim{unit: pl.unit, out: io.Discard, sites: pl.sites}
		if err := sim.resolve(&s, pl.cat, pl.file); err != nil {
			return sc, err
		}
		if err := sim.run(ctx); err != nil {
			return sc, err
		}
		loss, held, err := sim.finalLoss()
		if err != nil {
			return sc, err
		}
		if !held {
			sc.On = "training rows"
		}
		losses = append(losses, loss)
	}
	sc.Runs = len(losses)
	for _, l := range losses {
		sc.Loss += l / float64(len(losses))
	}
	for _, l := range losses {
		sc.SD += (l - sc.Loss) * (l - sc.Loss) / float64(max(1, len(losses)-1))
	}
	sc.SD = math.Sqrt(sc.SD)
	return sc, nil
}

// describeSteps says which steps the plan prices.
func (pl *planner) describeSteps() string {
	var parts []string
	if pl.spec.StandardizeMode() == fl.StandardizeFederated {
		parts = append(parts, "a statistics step")
	}
	parts = append(parts, fmt.Sprintf("%d training rounds", pl.spec.Rounds))
	if n := pl.evaluations(); n > 0 {
		parts = append(parts, fmt.Sprintf("%d evaluation steps", n))
	}
	return strings.Join(parts, ", ")
}

func (pl *planner) print(w io.Writer, choices []planChoice, best int, out string) {
	fmt.Fprintf(w, "%s DP for %s (%s): ε ≤ %g for the run and ≤ %g per step at δ = %g\n",
		pl.unit, pl.runName(), pl.describeSteps(), pl.eps, pl.roundEps, pl.delta)
	if len(choices) > 1 {
		fmt.Fprintf(w, "  stats share  sums_sigma  sigma   ε run   simulated loss (%s each, on %s)\n", plural(pl.repeats, "run"), choices[0].Simulated.On)
		for i, c := range choices {
			mark := " "
			if i == best {
				mark = "*"
			}
			fmt.Fprintf(w, "%s %-11.3g  %-10g  %-6g  %-6.4g  %.4f ± %.4f\n", mark, c.StatsShare, c.SumsSigma, c.Sigma, c.Epsilon, c.Simulated.Loss, c.Simulated.SD)
		}
	}
	c := choices[best]
	if c.StatsShare > 0 {
		fmt.Fprintf(w, "statistics: ε %.3g alone (share %.3g), σ = %g\n", c.StatsShare*pl.eps, c.StatsShare, c.SumsSigma)
	}
	if n := pl.evaluations(); n > 0 {
		fmt.Fprintf(w, "evaluation: %d releases, ε %.3g alone together (share %g), σ = %g each\n", n, pl.evalShare*pl.eps, pl.evalShare, c.EvalSigma)
	}
	if pl.unit == fl.UnitRecord {
		fmt.Fprintf(w, "training: σ = %g, q = %g (expected batch %d), %d steps per round\n", c.Sigma, c.Q, c.Batch, c.Steps)
	} else {
		fmt.Fprintf(w, "training: σ = %g per round (the whole update, q = 1)\n", c.Sigma)
	}
	fmt.Fprintf(w, "the run as its silos charge it: ε = %.4g composed (%s conversion), at most %.4g for one step\n", c.Epsilon, pl.conv, c.RoundEpsilon)
	fmt.Fprintf(w, "in the run file:\n  privacy: {%s}\n", privacyLine(c, pl.unit))
	if pl.unit == fl.UnitRecord {
		fmt.Fprintf(w, "  strategy params: {steps: %d}   # one model.train of that many DP-SGD steps per round\n", c.Steps)
	}
	fmt.Fprintf(w, "and in each silo's dataset: unit: %s, budget: {epsilon: %g, delta: %g}\n", pl.unit, pl.eps, pl.delta)
	if out != "" {
		fmt.Fprintf(w, "wrote %s\n", out)
	}
}

func (pl *planner) runName() string {
	if pl.file == "" {
		return "the default run"
	}
	return "run " + pl.spec.Name
}

// privacyLine is the planned privacy section in YAML flow form.
func privacyLine(c planChoice, unit fl.Unit) string {
	parts := []string{fmt.Sprintf("clip: %g", c.spec.Clip), fmt.Sprintf("sigma: %g", c.Sigma)}
	if unit == fl.UnitRecord {
		parts = append(parts, fmt.Sprintf("q: %g", c.Q), fmt.Sprintf("steps: %d", c.Steps))
	}
	if c.SumsSigma > 0 {
		parts = append(parts, fmt.Sprintf("sums_sigma: %g", c.SumsSigma))
	}
	if c.EvalSigma > 0 {
		parts = append(parts, fmt.Sprintf("eval_sigma: %g", c.EvalSigma))
	}
	return strings.Join(parts, ", ")
}

// writeRun writes the run file with the chosen settings, and reads it
// back: the file as written must price as planned.
func (pl *planner) writeRun(path string, c planChoice) error {
	b, err := plannedRunFile(pl.src, c, pl.unit)
	if err != nil {
		return err
	}
	again, err := fl.ParseRunSpec(path, b)
	if err != nil {
		return err
	}
	check := c
	check.spec = again
	if err := pl.check(&check); err != nil {
		return err
	}
	if check.Epsilon != c.Epsilon {
		return fmt.Errorf("privacy plan: %s prices at ε = %v, the plan at %v", path, check.Epsilon, c.Epsilon)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return job.WriteFileAtomic(path, b)
}

// ceil3 rounds σ up to three decimals, so the printed value never spends
// more than the plan.
func ceil3(x float64) float64 { return math.Ceil(x*1000) / 1000 }

// floor6 rounds a sampling rate down to six decimals (a smaller q spends
// less), so the printed value is the planned one; a rate below 10⁻⁶ is
// kept as it is.
func floor6(q float64) float64 {
	if f := math.Floor(q*1e6) / 1e6; f > 0 {
		return f
	}
	return q
}

// requireCount parses a required positive integer flag.
func requireCount(c *cobra.Command, name, s string) (int64, error) {
	if !c.Flags().Changed(name) {
		return 0, usageError{fmt.Errorf("--%s is required", name)}
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != s {
		return 0, diag.New(diag.InvalidValue, name, "--%s %q: want a positive whole number", name, s).
			WithHelp("for example --%s 800", name)
	}
	return n, nil
}

// accountingFlags are the accountant's --orders and --conversion, shared by
// the privacy commands.
type accountingFlags struct{ orders, conv string }

func (a *accountingFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&a.orders, "orders", "default", "Rényi orders: numbers, A:B or A:B:STEP ranges, comma-separated")
	c.Flags().StringVar(&a.conv, "conversion", "improved", "RDP to (ε, δ) conversion: improved (Balle et al. 2020) or classic (Mironov 2017)")
}

func (a *accountingFlags) parse() ([]float64, dp.Conversion, error) {
	o, err := parseOrders(a.orders)
	if err != nil {
		return nil, 0, err
	}
	cv, err := dp.ParseConversion(a.conv)
	if err != nil {
		return nil, 0, err
	}
	return o, cv, nil
}
