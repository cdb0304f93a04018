package main

import (
	"fmt"
	"math"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

func newPrivacyPlanCmd() *cobra.Command {
	var eps, roundEps, delta, rows, rounds string
	var af accountingFlags
	c := &cobra.Command{
		Use:   "plan --epsilon E --delta D --rows N --rounds R",
		Short: "Recommend record-level DP-SGD settings (σ, q, steps per round) for a budget",
		Long: `Recommend record-level DP-SGD settings for a federated run of R rounds over
silos of N records each that spends at most ε (composed over the run) and at
most --round-epsilon in any one round, at δ: an expected batch of about N/25
records (q = batch/N), one local epoch per round (fewer steps if the noise the
budget needs would exceed σ = 2.5), and the least σ meeting both targets.

Record-level DP suits a federation of a few sites: each site trains on many
records, and the noise is divided by the batch, so the model stays useful at
ε of a few units. Update-level DP (unit silo) protects a whole site and needs
many sites before the averaged noise is small; see docs/dp.md.`,
		Args:    cobra.NoArgs,
		Example: `  scellis privacy plan --epsilon 6 --delta 1e-5 --rows 800 --rounds 6`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := requireFloat(cmd, "epsilon", eps, diag.DPBadEpsilon)
			if err != nil {
				return err
			}
			d, err := requireFloat(cmd, "delta", delta, diag.DPBadDelta)
			if err != nil {
				return err
			}
			re, derr := parseNumber("round-epsilon", roundEps, diag.DPBadEpsilon)
			if derr != nil {
				return derr
			}
			n, err := requireCount(cmd, "rows", rows)
			if err != nil {
				return err
			}
			r, err := requireCount(cmd, "rounds", rounds)
			if err != nil {
				return err
			}
			o, cv, err := af.parse()
			if err != nil {
				return err
			}
			p, err := dp.PlanDPSGD(e, re, d, int(n), int(r), o, cv)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeJSON(out, p)
			}
			fmt.Fprintf(out, "record-level DP-SGD for %d rounds over %d records per silo, ε ≤ %g for the run and ≤ %g per round at δ = %g:\n", r, n, e, re, d)
			fmt.Fprintf(out, "  σ = %g, q = %.4g (expected batch %d), %d steps per round\n", ceil3(p.Sigma), p.Q, p.Batch, p.StepsPerRound)
			fmt.Fprintf(out, "  spends ε = %.4g per round alone and ε = %.4g for the run (composed, %s conversion)\n", p.RoundEpsilon, p.Epsilon, cv)
			fmt.Fprintf(out, "in the run file:\n  privacy: {clip: 1.0, sigma: %g, q: %.4g, steps: %d}\n", ceil3(p.Sigma), p.Q, p.StepsPerRound)
			fmt.Fprintf(out, "  strategy params: {steps: %d}   # one model.train of that many DP-SGD steps per round\n", p.StepsPerRound)
			fmt.Fprintf(out, "and in each silo's dataset: unit: record, budget: {epsilon: %g, delta: %g}\n", e, d)
			return nil
		},
	}
	c.Flags().StringVar(&eps, "epsilon", "", "ε for the whole run (required)")
	c.Flags().StringVar(&roundEps, "round-epsilon", "1", "most ε any one round may spend alone")
	c.Flags().StringVar(&delta, "delta", "", "δ, in (0, 1), well below 1/rows (required)")
	c.Flags().StringVar(&rows, "rows", "", "records per silo (required)")
	c.Flags().StringVar(&rounds, "rounds", "", "rounds of the run (required)")
	af.register(c)
	return c
}

// ceil3 rounds σ up to three decimals, so the printed value never spends
// more than the plan.
func ceil3(x float64) float64 { return math.Ceil(x*1000) / 1000 }

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
