package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

func newFLSimulateCmd() *cobra.Command {
	var data, evalData, label, unit, out string
	cmd := &cobra.Command{
		Use:   "simulate RUN.yaml --data DIR",
		Short: "Run a training run in this process over many sites (one CSV each): tune before spending budget",
		Long: `fl simulate runs the run spec's steps — the feature-statistics step, the
training rounds and the final evaluation — over the sites in DIR (one CSV
per site, named after the site), in this process, with no network: the
same strategies, client and server steps, DP mechanisms and grid encoding,
per-site seeds and data preparation as the silos, with plain sums where the
federation has secure aggregation. It prints the table fl watch prints and
writes the same model file.`,
		Example: `  scellis datagen hospitals --sites 100 --rows 200 --out sites
  scellis fl simulate run.yaml --data sites --out model.json`,
		Args: exactArgs(1, "RUN.yaml"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			if data == "" {
				return usageError{fmt.Errorf("give the sites' folder with --data DIR (one CSV per site)")}
			}
			spec, err := fl.LoadRunSpec(args[0])
			if err != nil {
				return err
			}
			if spec.Trainer != "" {
				return diag.New(diag.FLBadSimulation, args[0], "fl simulate runs the built-in models; this run names trainer %s", spec.Trainer).
					WithHelp("try the trainer on one site's file with scellis trainer train %s --data FILE (docs/trainers.md)", spec.Trainer)
			}
			cat, err := openCatalog()
			if err != nil {
				return err
			}
			sim := &flSim{unit: fl.Unit(unit), out: cmd.OutOrStdout()}
			if err := sim.load(spec, cat, args[0], data, evalData, label); err != nil {
				return err
			}
			if err := sim.run(ctx); err != nil {
				return err
			}
			if out != "" {
				return sim.writeModel(out, cmd.ErrOrStderr())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "folder of site CSVs (one per site; the file name without .csv is the site's name)")
	cmd.Flags().StringVar(&evalData, "eval-data", "", "folder of the sites' evaluation CSVs, same file names (for evaluation: {dataset: …})")
	cmd.Flags().StringVar(&label, "label", "", "label column (default: the run's model.label)")
	cmd.Flags().StringVar(&unit, "unit", string(fl.UnitRecord), "the sites' unit of privacy when DP is on: record or silo")
	cmd.Flags().StringVar(&out, "out", "", "write the final model file here (docs/models.md)")
	return cmd
}

// flSim is one fl simulate: the live path's steps over in-process sites.
type flSim struct {
	spec  *fl.RunSpec
	canon *fl.Canonical
	id    content.Ref
	strat *fl.Strategy
	env   script.Env
	unit  fl.Unit
	*sites
	std    *fl.Standardization
	rows   []fl.RoundSummary
	global fl.Global
	out    io.Writer
}

// minSimSites is the federation's floor: secure aggregation refuses fewer.
const minSimSites = 3

// load resolves the run and reads the sites.
func (s *flSim) load(spec *fl.RunSpec, cat *catalog.Catalog, file, dir, evalDir, label string) error {
	if err := s.resolve(spec, cat, file); err != nil {
		return err
	}
	var err error
	s.sites, err = readSites(spec, dir, evalDir, label)
	return err
}

// resolve resolves the run file's spec: its ID, strategy and params.
func (s *flSim) resolve(spec *fl.RunSpec, cat *catalog.Catalog, file string) error {
	var err error
	s.spec = spec
	var st *fl.Strategy
	if s.canon, s.id, st, err = spec.Resolve(cat, filepath.Dir(file)); err != nil {
		return err
	}
	// The silos' and the aggregator's params: the spec's, with the model's.
	if s.strat, err = fl.NewStrategy(st.Entry, s.canon.Params()); err != nil {
		return err
	}
	s.env = script.Env{Catalog: cat}
	return nil
}

// sites are the sites of a simulation: one CSV each in a folder, named
// after the site, and its evaluation CSV when the run names an
// evaluation dataset.
type sites struct {
	names []string
	raw   []*model.Dataset
	evals []*model.Dataset
}

// readSites reads the sites in dir (and evalDir) for spec.
func readSites(spec *fl.RunSpec, dir, evalDir, label string) (*sites, error) {
	if label == "" {
		label = spec.Model.Label
	}
	if label == "" {
		return nil, usageError{fmt.Errorf("the run names no label column (model.label): give it with --label COL")}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.csv"))
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	if len(files) < minSimSites {
		return nil, diag.New(diag.FLBadSimulation, dir, "%d site files (*.csv); a federation needs at least %d sites", len(files), minSimSites).
			WithHelp("with two sites each could learn the other's update from the sum: put one CSV per site, at least three, in the folder")
	}
	s := &sites{}
	var problems diag.List
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".csv")
		d, err := model.LoadCSV(f, label)
		if err != nil {
			problems = append(problems, asDiagList(err)...)
			continue
		}
		s.names, s.raw = append(s.names, name), append(s.raw, d)
		if spec.Eval.Dataset != "" {
			if evalDir == "" {
				return nil, usageError{fmt.Errorf("the run evaluates on dataset %q: give the sites' evaluation CSVs with --eval-data DIR", spec.Eval.Dataset)}
			}
			e, err := model.LoadCSV(filepath.Join(evalDir, filepath.Base(f)), label)
			if err != nil {
				problems = append(problems, asDiagList(err)...)
				continue
			}
			s.evals = append(s.evals, e)
		} else {
			s.evals = append(s.evals, nil)
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return s, nil
}

func asDiagList(err error) diag.List {
	if ds, ok := diag.As(err); ok {
		return ds
	}
	return diag.List{diag.New(diag.CSVUnreadable, "fl simulate", "%v", err)}
}

// privacy is the sites' DP in training rounds: the run's, at the --unit
// given; stepPrivacy that of a statistics or evaluation step.
func (s *flSim) privacy() fl.Privacy { return s.spec.Privacy(s.unit) }

func (s *flSim) stepPrivacy(step string) fl.Privacy { return s.spec.StepPrivacy(s.unit, step) }

// siteData prepares every site for a step, as fl.SiteData does at a silo.
func (s *flSim) siteData(step string) (trains, helds []*model.Dataset, err error) {
	for i, name := range s.names {
		tr, he, err := fl.SiteData(s.canon, s.id, name, s.raw[i], s.evals[i], step, s.std)
		if err != nil {
			return nil, nil, err
		}
		trains, helds = append(trains, tr), append(helds, he)
	}
	return trains, helds, nil
}

// sumReleases sums the sites' releases of one statistics or evaluation
// step in site order, as secure aggregation would: floats without DP,
// grid integers (decoded after the sum) under DP. It returns the sum and
// the ε each site was charged.
func (s *flSim) sumReleases(p fl.Privacy, dim, grid int, plain func(i int) ([]float64, error), release func(i int) ([]int64, []dp.Mechanism, error)) ([]float64, map[string]float64, error) {
	eps := map[string]float64{}
	if p.Unit == fl.UnitNone {
		sum := make([]float64, dim)
		for i := range s.names {
			v, err := plain(i)
			if err != nil {
				return nil, nil, err
			}
			for j := range sum {
				sum[j] += v[j]
			}
		}
		return sum, eps, nil
	}
	isum := make([]int64, dim)
	for i, name := range s.names {
		y, mechs, err := release(i)
		if err != nil {
			return nil, nil, err
		}
		if len(y) != dim {
			return nil, nil, fmt.Errorf("site %s released %d values; the step sums %d", name, len(y), dim)
		}
		for j, v := range y {
			isum[j] += v
		}
		if eps[name], err = epsilonOf(mechs); err != nil {
			return nil, nil, err
		}
	}
	return dp.FromGrid(isum, grid), eps, nil
}

// epsilonOf is the ε of one charge at δ = 1e-5 (the figure fl watch shows
// is each ledger's own δ; a simulation has no ledger).
func epsilonOf(mechs []dp.Mechanism) (float64, error) {
	acc, err := dp.NewAccountant(dp.DefaultOrders())
	if err != nil {
		return 0, err
	}
	for _, m := range mechs {
		if err := acc.Compose(m); err != nil {
			return 0, err
		}
	}
	eps, _, err := acc.Epsilon(1e-5, dp.Improved)
	return eps, err
}

// run runs the steps and prints the round table.
func (s *flSim) run(ctx context.Context) error {
	w := s.out
	if !jsonOutput {
		fmt.Fprintf(w, "simulated run %s (%s): %d steps, %d sites in this process (plain sums in place of secure aggregation)\n",
			s.spec.Name, s.id.Short(), s.spec.StepCount(), len(s.names))
		printRoundHeader(w)
	}
	emit := func(row fl.RoundSummary) {
		s.rows = append(s.rows, row)
		if jsonOutput {
			b, _ := json.Marshal(row)
			fmt.Fprintln(w, string(b))
			return
		}
		printRoundRow(w, row)
	}
	if s.spec.StandardizeMode() == fl.StandardizeFederated {
		if err := s.statsStep(ctx, emit); err != nil {
			return err
		}
	} else {
		s.std = &fl.Standardization{Mode: s.spec.StandardizeMode()}
	}
	trains, helds, err := s.siteData(fl.StepTrain)
	if err != nil {
		return err
	}
	dpOn := s.privacy().Unit != fl.UnitNone
	var roundErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Training round t is the run's coordinator round TrainStep(t): the
	// statistics step and any evaluation steps come between.
	step := s.spec.TrainStep
	hist, err := fl.Simulate(ctx, s.strat, trains, s.spec.Rounds, fl.SimOptions{
		Env: s.env, Seed: uint64(s.spec.Seed), Privacy: s.privacy(),
		ClientSeed:  func(r, i int) [32]byte { return fl.ClientSeed(s.id, step(r), s.spec.Seed, s.names[i]) },
		RoundCohort: func(r int) ([]int, []float64) { return s.roundCohort(step(r)) },
		OnRound: func(r fl.Round) {
			sums := map[string]float64{}
			if !dpOn { // under DP the live round sums the update alone
				maps.Copy(sums, r.Metrics)
				if s.spec.Eval.On() {
					m, err := s.heldOutPlain(r.Start, helds)
					if err != nil && roundErr == nil {
						roundErr = err
					}
					maps.Copy(sums, m)
				}
			}
			h, _ := r.Global.Hash()
			names := make([]string, len(r.Cohort))
			for j, i := range r.Cohort {
				names[j] = s.names[i]
			}
			row := fl.NewRoundSummary(step(r.Index), fl.StepTrain, names, []string{}, sums, h)
			for i, mechs := range r.Charges {
				if e, err := epsilonOf(mechs); err == nil {
					row.Epsilon[s.names[i]] = e
				}
			}
			emit(row)
			// evaluation.every: an evaluation step of the new global.
			if t := r.Index + 1; t < s.spec.Rounds && step(t) > step(r.Index)+1 && roundErr == nil {
				if roundErr = s.evalStep(ctx, r.Global, helds, step(r.Index)+1, emit); roundErr != nil {
					cancel()
				}
			}
		},
	})
	if roundErr != nil {
		return roundErr
	}
	if err != nil {
		return err
	}
	s.global = hist.Final
	if s.spec.Eval.On() {
		return s.evalStep(ctx, s.global, helds, s.spec.StepCount()-1, emit)
	}
	return nil
}

// roundCohort is coordinator round r's cohort and work as the live path
// draws them (RunSpec.RoundCohort, keyed by the run's ID and the round,
// over every site, all alive in a simulation): the sites a live run of the
// same spec over silos of the same names would sample and straggle.
func (s *flSim) roundCohort(r int) ([]int, []float64) {
	cohort, work := s.spec.RoundCohort(s.id, r, fl.StepTrain, s.names)
	idx := make([]int, len(cohort))
	fracs := make([]float64, len(cohort))
	for j, name := range cohort {
		idx[j] = slices.Index(s.names, name)
		fracs[j] = 1
		if w, ok := work[name]; ok {
			fracs[j] = w
		}
	}
	return idx, fracs
}

func (s *flSim) statsStep(ctx context.Context, emit func(fl.RoundSummary)) error {
	trains, _, err := s.siteData(fl.StepStats)
	if err != nil {
		return err
	}
	dims, _, grid, err := s.spec.StepSums(ctx, s.env, s.strat, nil, fl.StepStats)
	if err != nil {
		return err
	}
	d := s.spec.Model.Inputs
	p := s.stepPrivacy(fl.StepStats)
	bounds := s.spec.Bounds()
	if p.Unit != fl.UnitNone && bounds.Len() != d {
		return diag.New(diag.ModelNoStatistics, "run "+s.spec.Name, "the run's DP is on but it gives %d feature bounds for %d features", bounds.Len(), d).
			WithHelp("add privacy.feature_bounds, one public bound per model input")
	}
	sum, eps, err := s.sumReleases(p, dims+1, grid,
		func(i int) ([]float64, error) {
			v, rows := fl.StatsVector(trains[i])
			return append(v, rows), nil
		},
		func(i int) ([]int64, []dp.Mechanism, error) {
			return p.ReleaseStats(trains[i], bounds, s.spec.PublicRows, grid)
		})
	if err != nil {
		return err
	}
	if s.std, err = fl.StatsFromSums(sum[:dims], sum[dims], s.spec.StatsDP(len(trains))); err != nil {
		return diag.New(diag.ModelNoStatistics, "run "+s.spec.Name, "the feature statistics are unusable: %v", err)
	}
	row := fl.NewRoundSummary(0, fl.StepStats, s.names, []string{}, map[string]float64{"rows": sum[dims]}, "")
	row.Epsilon = eps
	emit(row)
	return nil
}

// heldOutPlain sums the sites' held-out metrics of global g (DP off).
func (s *flSim) heldOutPlain(g fl.Global, helds []*model.Dataset) (map[string]float64, error) {
	w, _ := g.Vector("w")
	out := map[string]float64{}
	for _, h := range helds {
		m, err := fl.EvalSums(s.canon.ModelSpec(), w, h)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			out[k] += v
		}
	}
	return out, nil
}

// evalStep is coordinator round round, an evaluation step of global g.
func (s *flSim) evalStep(ctx context.Context, g fl.Global, helds []*model.Dataset, round int, emit func(fl.RoundSummary)) error {
	_, names, grid, err := s.spec.StepSums(ctx, s.env, s.strat, g, fl.StepEval)
	if err != nil {
		return err
	}
	p := s.stepPrivacy(fl.StepEval)
	w, ok := g.Vector("w")
	if !ok {
		return diag.New(diag.FLContract, "evaluation", "the global state has no parameter vector w to evaluate")
	}
	sum, eps, err := s.sumReleases(p, len(names), grid,
		func(i int) ([]float64, error) {
			m, err := fl.EvalSums(s.canon.ModelSpec(), w, helds[i])
			if err != nil {
				return nil, err
			}
			v := make([]float64, len(names))
			for j, k := range names {
				v[j] = m[k]
			}
			return v, nil
		},
		func(i int) ([]int64, []dp.Mechanism, error) {
			rows, err := fl.EvalRecords(s.canon.ModelSpec(), w, helds[i])
			if err != nil {
				return nil, nil, err
			}
			return p.ReleaseRecordSums(rows, len(names), fl.EvalSensitivity(), grid)
		})
	if err != nil {
		return err
	}
	sums := map[string]float64{}
	for j, k := range names {
		sums[k] = sum[j]
	}
	h, _ := g.Hash()
	row := fl.NewRoundSummary(round, fl.StepEval, s.names, []string{}, sums, h)
	row.Epsilon = eps
	emit(row)
	return nil
}

// finalLoss is the final model's mean loss per row on the sites'
// held-out rows, computed here without noise (on their training rows when
// the run holds none out: held is false then), standardised as the model
// file would have it: how privacy plan scores a simulated run.
func (s *flSim) finalLoss() (loss float64, held bool, err error) {
	trains, helds, err := s.siteData(fl.StepTrain)
	if err != nil {
		return 0, false, err
	}
	w, ok := s.global.Vector("w")
	if !ok {
		return 0, false, diag.New(diag.FLContract, "evaluation", "the global state has no parameter vector w to evaluate")
	}
	rows, held := helds, s.spec.Eval.On()
	if !held {
		rows = trains
	}
	var sum, n float64
	for _, d := range rows {
		m, err := fl.EvalSums(s.canon.ModelSpec(), w, d)
		if err != nil {
			return 0, false, err
		}
		sum, n = sum+m["eval_loss"], n+m["eval_examples"]
	}
	if n == 0 {
		return 0, false, diag.New(diag.FLBadSimulation, "fl simulate", "no rows to score the final model on")
	}
	return sum / n, held, nil
}

// writeModel writes the model file of the simulation, as fl model does
// for a live run (no receipts: nothing was verified by a pool), unsigned:
// no aggregator node assembled it, so model verify reports it unsigned
// (SC9407).
func (s *flSim) writeModel(path string, log io.Writer) error {
	f, err := fl.NewModelFile(s.canon, s.global, s.std)
	if err != nil {
		return err
	}
	h, _ := s.global.Hash()
	f.Run = fl.ModelRun{ID: s.id, Name: s.spec.Name, State: "simulated", Spec: s.canon}
	f.Rounds = s.rows
	f.Privacy = []fl.SiloCharges{}
	charges := map[string]*fl.SiloCharges{}
	for _, r := range s.rows {
		for site, e := range r.Epsilon {
			if charges[site] == nil {
				charges[site] = &fl.SiloCharges{Silo: site}
			}
			charges[site].Rounds++
			charges[site].EpsilonSum += e
		}
	}
	for _, site := range slices.Sorted(maps.Keys(charges)) {
		f.Privacy = append(f.Privacy, *charges[site])
	}
	f.Refs = fl.ModelRefs{Run: s.id, Strategy: s.canon.Strategy, Model: h, RoundResults: []content.Ref{}, RoundJobs: []content.Ref{}, Receipts: []content.Ref{}}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := job.WriteFileAtomic(path, append(b, '\n')); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s: %s model %s of %d inputs (standardisation %s), simulated over %d sites (unsigned: no cluster exported it)\n", path, f.Kind, h.Short(), f.Inputs, f.Standardization.Mode, len(s.names))
	return nil
}
