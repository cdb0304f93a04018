package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl/account"
	"github.com/scellis/scellis/receipt"
)

func newPrivacyReportCmd() *cobra.Command {
	var m memberFlags
	var format string
	c := &cobra.Command{
		Use:   "report RUN [--format table|json|csv]",
		Short: "What a training run cost each silo's dataset, with the receipts that prove each charge",
		Long: `Report reads the signed contribution records of a run's round jobs — the
same account of ε that fl watch, fl model and the Studio read — checks each
charge against the replicated receipt chain, and prints per silo and
dataset: the mechanism, σ and sampling rate q, the rounds contributed (every
round charged, a failed secure aggregation included: the charge stands) and
declined, ε of each round, this run's ε composed in RDP at the dataset's δ,
the dataset's cumulative ε in the silo's ledger (every charge, all runs), its
budget and what remains, and the receipts proving each charge (receipt
number, and in JSON the receipt, contribution and ledger entry hashes).
A charge made in a round attempt the aggregator abandoned (a leader change,
a failed secure aggregation that was retried) has no receipt: the silo's
signed record of it is read from the abandoned job's replicated reports and
listed as "abandoned:JOB". A silo stopped after paying for a round and
before reporting it delivers the round's record from its outbox when it
starts again; a record that reached a round already reduced without it has
no receipt either, and is listed as "late:JOB". A charge is counted once,
however many records name it (a retried round re-sends the update that
attempt paid for).

The chain is verified first, and every record must carry a valid signature
of the silo named in it (federation file). The run's ε is composed on the
default Rényi order grid with the improved conversion; a ledger created with
another grid may state a slightly different cumulative ε (the ledger's own
figure is the LEDGER ε column). To check a silo's ledger against the same
receipts, run 'scellis ledger audit' at the silo.`,
		Example: `  scellis privacy report 3f9c2a1b7d04
  scellis privacy report 3f9c2a1b7d04 --format csv > run-privacy.csv`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if jsonOutput {
				format = "json"
			}
			if format != "table" && format != "json" && format != "csv" {
				return diag.New(diag.InvalidValue, "format", "unknown report format %q", format).WithHelp("use table, json or csv")
			}
			cl, fed, err := m.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			id, err := resolveID(ctx, cl, args[0], runID)
			if err != nil {
				return err
			}
			run, err := cl.Run(ctx, id)
			if err != nil {
				return err
			}
			rs, err := cl.Receipts(ctx, 0)
			if err != nil {
				return err
			}
			if err := receipt.Verify(rs); err != nil {
				return err
			}
			a, err := account.NewReader(poolSource{cl}, fed).Run(ctx, run)
			if err != nil {
				return err
			}
			rows, cited, err := provedRows(a, rs)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch format {
			case "json":
				return writeJSON(out, map[string]any{"run": id, "name": run.Name, "state": run.State, "rounds": run.Rounds, "silos": rows})
			case "csv":
				return privacyCSV(out, rows)
			}
			fmt.Fprintf(out, "run %s (%s): %s, %d rounds, %d signed records of its silos, %d of them cited by receipts\n\n", run.Name, id.Short(), run.State, run.Rounds, len(a.Records), cited)
			privacyTable(out, rows)
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "table", "table, json or csv (--json is json)")
	m.register(c)
	return c
}

// provedRows checks the run's account against the verified receipt
// chain: every record carries a valid signature of the silo named in it,
// and every charge proved by a receipt is the record that receipt cites.
// It returns the datasets with each receipt's hash, and how many records
// receipts cite.
func provedRows(a *account.Run, rs []receipt.Receipt) ([]account.Dataset, int, error) {
	cited := 0
	for _, rec := range a.Records {
		if !rec.Verified {
			return nil, 0, diag.New(diag.ReceiptMalformed, fmt.Sprintf("job %s", rec.ReportedTo.Short()), "the contribution record %s of %s does not carry a valid signature of %s", rec.Ref.Short(), rec.Silo, rec.Silo).
				WithHelp("the record was not signed by the silo's key in this federation file: check the file, then the silo's identity")
		}
		if rec.Proof == account.ByReceipt {
			cited++
		}
	}
	bySeq := make(map[uint64]receipt.Receipt, len(rs))
	for _, r := range rs {
		bySeq[r.Seq] = r
	}
	rows := slices.Clone(a.Datasets)
	for i := range rows {
		rows[i].Charges = slices.Clone(rows[i].Charges)
		for k, ch := range rows[i].Charges {
			if ch.Receipt == 0 {
				continue
			}
			r, ok := bySeq[ch.Receipt]
			if !ok || r.Result != ch.Contribution {
				return nil, 0, diag.New(diag.ReceiptMalformed, fmt.Sprintf("receipt %d", ch.Receipt), "the receipt chain does not cite %s's round %d record %s there", rows[i].Silo, ch.Round, ch.Contribution.Short()).
					WithHelp("the chain and the job's state disagree: run scellis receipts verify")
			}
			rows[i].Charges[k].ReceiptHash = r.Hash
		}
	}
	return rows, cited, nil
}

func floats(vs []float64, sep string) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatFloat(v, 'g', 6, 64)
	}
	return strings.Join(s, sep)
}

func receiptList(cs []account.Charge, sep string) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = strconv.FormatUint(c.Receipt, 10)
		if c.AbandonedJob != "" {
			s[i] = "abandoned:" + c.AbandonedJob.Short() // no receipt: the attempt's job holds the record
		}
		if c.LateJob != "" {
			s[i] = "late:" + c.LateJob.Short() // no receipt: the reduced job holds the late record
		}
	}
	return strings.Join(s, sep)
}

func privacyTable(out io.Writer, rows []account.Dataset) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SILO\tDATASET\tMECHANISM\tσ\tq\tROUNDS\tDECLINED\tε PER ROUND\tRUN ε\tδ\tLEDGER ε\tBUDGET ε\tREMAINING ε\tRECEIPTS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%.4g\t%g\t%.4g\t%g\t%.4g\t%s\n", r.Silo, r.Dataset, r.Mechanism,
			floats(r.Sigma, ","), floats(r.Q, ","), r.Rounds, r.Declined, floats(r.PerRound, ","), r.RunEps, r.Delta,
			r.LedgerEps, r.Budget, r.Remaining, receiptList(r.Charges, ","))
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no silo has reported a round of this run yet)")
	}
	tw.Flush()
}

func privacyCSV(out io.Writer, rows []account.Dataset) error {
	cw := csv.NewWriter(out)
	cw.Write([]string{"silo", "dataset", "mechanism", "sigma", "q", "rounds_contributed", "rounds_declined", "epsilon_per_round",
		"run_epsilon", "delta", "ledger_cumulative_epsilon", "budget_epsilon", "remaining_epsilon", "receipts"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, r := range rows {
		cw.Write([]string{csvText(r.Silo), csvText(r.Dataset), r.Mechanism, floats(r.Sigma, ";"), floats(r.Q, ";"),
			strconv.Itoa(r.Rounds), strconv.Itoa(r.Declined), floats(r.PerRound, ";"), f(r.RunEps), f(r.Delta),
			f(r.LedgerEps), f(r.Budget), f(r.Remaining), receiptList(r.Charges, ";")})
	}
	cw.Flush()
	return cw.Error()
}
