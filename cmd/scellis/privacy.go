package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

func init() {
	commands = append(commands, newPrivacyCmd)
}

func newPrivacyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "privacy",
		Short: "Compute differential-privacy costs with the RDP accountant",
		Long: `The privacy commands run the Rényi-DP accountant of the Poisson-subsampled
Gaussian mechanism (Mironov, Talwar, Zhang 2019) without touching a ledger:
estimate ε for a training plan, calibrate the noise for a target ε, or find
how many steps a budget allows. See docs/dp.md.`,
	}
	c.AddCommand(newPrivacyEstimateCmd(), newPrivacyCalibrateCmd(), newPrivacyMaxStepsCmd(), newPrivacyReportCmd(), newPrivacyPlanCmd())
	return c
}

// mechanismFlags are the repeatable --sigma/--q/--steps triples.
type mechanismFlags struct{ sigma, q, steps []string }

func (m *mechanismFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVar(&m.sigma, "sigma", nil, "noise multiplier σ (noise std / clipping bound); repeat with --q and --steps to compose mechanisms")
	c.Flags().StringArrayVar(&m.q, "q", nil, "Poisson sampling rate q in (0, 1] (1 = every record every step)")
	c.Flags().StringArrayVar(&m.steps, "steps", nil, "number of steps T")
}

func (m *mechanismFlags) parse() ([]dp.Mechanism, error) {
	if len(m.sigma) == 0 {
		return nil, usageError{fmt.Errorf("give at least one --sigma, --q and --steps")}
	}
	if len(m.sigma) != len(m.q) || len(m.q) != len(m.steps) {
		return nil, diag.New(diag.InvalidValue, "mechanisms", "%d --sigma, %d --q and %d --steps given: they must come in triples", len(m.sigma), len(m.q), len(m.steps)).
			WithHelp("give one --sigma, --q and --steps per mechanism, e.g. --sigma 1.1 --q 0.01 --steps 1000")
	}
	var out []dp.Mechanism
	var problems diag.List
	for i := range m.sigma {
		s, err1 := parseNumber("sigma", m.sigma[i], diag.DPBadSigma)
		q, err2 := parseNumber("q", m.q[i], diag.DPBadQ)
		t, err3 := parseSteps(m.steps[i])
		for _, d := range []*diag.Diagnostic{err1, err2, err3} {
			if d != nil {
				problems = append(problems, d)
			}
		}
		// Check each parsed value on its own, so every problem is reported.
		var checks []dp.Mechanism
		if err1 == nil {
			checks = append(checks, dp.SubsampledGaussian(s, 1, 1))
		}
		if err2 == nil {
			checks = append(checks, dp.SubsampledGaussian(1, q, 1))
		}
		ok := err1 == nil && err2 == nil && err3 == nil
		for _, m := range checks {
			if err := m.Validate(); err != nil {
				ds, _ := diag.As(err)
				problems = append(problems, ds...)
				ok = false
			}
		}
		if ok {
			out = append(out, dp.SubsampledGaussian(s, q, t))
		}
	}
	if err := problems.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// parseNumber parses a float flag; a non-number is a diagnostic of code.
func parseNumber(name, s string, code diag.Code) (float64, *diag.Diagnostic) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, diag.New(code, name, "--%s %q is not a number", name, s)
	}
	return v, nil
}

func parseSteps(s string) (int64, *diag.Diagnostic) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v != math.Trunc(v) || v < 1 || v > 1<<40 {
		return 0, diag.New(diag.DPBadSteps, "steps", "--steps %q is not a whole number of steps in [1, 2^40]", s).
			WithHelp("give a positive integer, e.g. 1000 or 1e4")
	}
	return int64(v), nil
}

// requireFloat parses a required float flag.
func requireFloat(c *cobra.Command, name, s string, code diag.Code) (float64, error) {
	if !c.Flags().Changed(name) {
		return 0, usageError{fmt.Errorf("--%s is required", name)}
	}
	v, d := parseNumber(name, s, code)
	if d != nil {
		return 0, d
	}
	return v, nil
}

// parseOrders parses an order grid: "default", or a comma list whose items
// are numbers, ranges A:B of integers, or A:B:STEP.
func parseOrders(s string) ([]float64, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "default" {
		return dp.DefaultOrders(), nil
	}
	bad := func(item string) error {
		return diag.New(diag.DPBadOrder, "orders", "cannot read order %q", item).
			WithHelp("give numbers greater than 1, ranges A:B or A:B:STEP, comma-separated, e.g. 1.1:10.9:0.1,12:63")
	}
	var out []float64
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		parts := strings.Split(item, ":")
		nums := make([]float64, len(parts))
		for i, p := range parts {
			v, err := strconv.ParseFloat(p, 64)
			if err != nil {
				return nil, bad(item)
			}
			nums[i] = v
		}
		switch len(nums) {
		case 1:
			out = append(out, nums[0])
		case 2, 3:
			step := 1.0
			if len(nums) == 3 {
				step = nums[2]
			}
			if !(step > 0) || !(nums[1] >= nums[0]) || (nums[1]-nums[0])/step > 10000 {
				return nil, bad(item)
			}
			n := int(math.Round((nums[1]-nums[0])/step)) + 1
			for k := range n {
				v, _ := strconv.ParseFloat(strconv.FormatFloat(nums[0]+float64(k)*step, 'g', 12, 64), 64)
				out = append(out, v)
			}
		default:
			return nil, bad(item)
		}
	}
	if err := dp.CheckOrders(out); err != nil {
		return nil, err
	}
	return out, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newPrivacyEstimateCmd() *cobra.Command {
	var mf mechanismFlags
	var delta string
	var af accountingFlags
	c := &cobra.Command{
		Use:   "estimate --sigma S --q Q --steps T --delta D",
		Short: "Print the (ε, δ) of a training plan",
		Long: `Estimate prints ε at the given δ for T steps of the Poisson-subsampled
Gaussian mechanism with noise multiplier σ and sampling rate q, minimised over
the Rényi orders, and the order that attains it. Repeat --sigma/--q/--steps
to compose several mechanisms (their RDP curves add).`,
		Example: `  scellis privacy estimate --sigma 1.1 --q 0.01 --steps 10000 --delta 1e-5
  scellis privacy estimate --sigma 4 --q 0.01 --steps 10000 --delta 1e-5 --orders 2:32 --conversion classic`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := mf.parse()
			if err != nil {
				return err
			}
			d, err := requireFloat(cmd, "delta", delta, diag.DPBadDelta)
			if err != nil {
				return err
			}
			o, cv, err := af.parse()
			if err != nil {
				return err
			}
			acc, err := dp.NewAccountant(o)
			if err != nil {
				return err
			}
			for _, m := range ms {
				if err := acc.Compose(m); err != nil {
					return err
				}
			}
			eps, order, err := acc.Epsilon(d, cv)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeJSON(out, map[string]any{
					"epsilon": eps, "order": order, "delta": d, "conversion": cv.String(), "mechanisms": ms,
				})
			}
			fmt.Fprintf(out, "ε = %.6g at δ = %g (order %g, %s conversion)\n", eps, d, order, cv)
			return nil
		},
	}
	mf.register(c)
	c.Flags().StringVar(&delta, "delta", "", "δ of the (ε, δ) guarantee, in (0, 1) (required)")
	af.register(c)
	return c
}

func newPrivacyCalibrateCmd() *cobra.Command {
	var eps, delta, q, steps string
	var af accountingFlags
	c := &cobra.Command{
		Use:     "calibrate --epsilon E --delta D --q Q --steps T",
		Short:   "Print the smallest noise multiplier σ that meets a target ε",
		Args:    cobra.NoArgs,
		Example: `  scellis privacy calibrate --epsilon 1 --delta 1e-5 --q 0.01 --steps 1000`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := requireFloat(cmd, "epsilon", eps, diag.DPBadEpsilon)
			if err != nil {
				return err
			}
			d, err := requireFloat(cmd, "delta", delta, diag.DPBadDelta)
			if err != nil {
				return err
			}
			qq, err := requireFloat(cmd, "q", q, diag.DPBadQ)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("steps") {
				return usageError{fmt.Errorf("--steps is required")}
			}
			t, derr := parseSteps(steps)
			if derr != nil {
				return derr
			}
			o, cv, err := af.parse()
			if err != nil {
				return err
			}
			if err := dp.SubsampledGaussian(1, qq, t).Validate(); err != nil {
				return err
			}
			sigma, err := dp.Calibrate(e, d, qq, t, o, cv)
			if err != nil {
				return err
			}
			rdp, _ := dp.RDPSubsampledGaussian(qq, sigma, t, o)
			got, order, _ := dp.Epsilon(o, rdp, d, cv)
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeJSON(out, map[string]any{
					"sigma": sigma, "epsilon": got, "target_epsilon": e, "order": order,
					"delta": d, "q": qq, "steps": t, "conversion": cv.String(),
				})
			}
			fmt.Fprintf(out, "σ = %.6g (gives ε = %.6g at δ = %g, order %g, %s conversion)\n", sigma, got, d, order, cv)
			return nil
		},
	}
	c.Flags().StringVar(&eps, "epsilon", "", "target ε (required)")
	c.Flags().StringVar(&delta, "delta", "", "δ, in (0, 1) (required)")
	c.Flags().StringVar(&q, "q", "", "Poisson sampling rate q in (0, 1] (required)")
	c.Flags().StringVar(&steps, "steps", "", "number of steps T (required)")
	af.register(c)
	return c
}

func newPrivacyMaxStepsCmd() *cobra.Command {
	var eps, delta, q, sigma string
	var af accountingFlags
	c := &cobra.Command{
		Use:   "max-steps --epsilon E --delta D --q Q --sigma S",
		Short: "Print how many steps a budget allows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := requireFloat(cmd, "epsilon", eps, diag.DPBadEpsilon)
			if err != nil {
				return err
			}
			d, err := requireFloat(cmd, "delta", delta, diag.DPBadDelta)
			if err != nil {
				return err
			}
			qq, err := requireFloat(cmd, "q", q, diag.DPBadQ)
			if err != nil {
				return err
			}
			s, err := requireFloat(cmd, "sigma", sigma, diag.DPBadSigma)
			if err != nil {
				return err
			}
			o, cv, err := af.parse()
			if err != nil {
				return err
			}
			if err := dp.CheckOrders(o); err != nil {
				return err
			}
			n, err := dp.MaxSteps(o, make([]float64, len(o)), qq, s, e, d, cv)
			if err != nil {
				return err
			}
			if jsonOutput {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"steps": n, "epsilon": e, "delta": d, "q": qq, "sigma": s})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d steps fit in ε = %g at δ = %g (σ = %g, q = %g)\n", n, e, d, s, qq)
			return nil
		},
	}
	c.Flags().StringVar(&eps, "epsilon", "", "budget ε (required)")
	c.Flags().StringVar(&delta, "delta", "", "δ, in (0, 1) (required)")
	c.Flags().StringVar(&q, "q", "", "Poisson sampling rate q in (0, 1] (required)")
	c.Flags().StringVar(&sigma, "sigma", "", "noise multiplier σ (required)")
	af.register(c)
	return c
}

func writeJSONCompact(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
