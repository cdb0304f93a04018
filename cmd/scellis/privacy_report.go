package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
)

// reportCharge is one round a silo paid for, and the receipt that proves it.
type reportCharge struct {
	Round        int            `json:"round"`
	Status       string         `json:"status"`
	Mechanisms   []dp.Mechanism `json:"mechanisms"`
	Epsilon      float64        `json:"epsilon"`
	LedgerEntry  content.Ref    `json:"ledger_entry"`
	Receipt      uint64         `json:"receipt"`
	ReceiptHash  content.Ref    `json:"receipt_hash"`
	Contribution content.Ref    `json:"contribution"`
	// AbandonedJob: the charge is proved by a record reported to a round
	// attempt the aggregator abandoned (no receipt: the attempt was never
	// reduced); the record is in that job's replicated shard reports.
	AbandonedJob content.Ref `json:"abandoned_job,omitempty"`
	// LateJob: the charge is proved by a record reported late to a round
	// job reduced without it (the silo stopped after paying, and its
	// outbox delivered the record when it started again): no receipt; the
	// record is in that job's replicated shard reports.
	LateJob content.Ref `json:"late_job,omitempty"`
}

// reportRow is one silo's dataset in a run's privacy report.
type reportRow struct {
	Silo      string         `json:"silo"`
	Dataset   string         `json:"dataset"`
	Mechanism string         `json:"mechanism"`
	Sigma     []float64      `json:"sigma"`
	Q         []float64      `json:"q"`
	Rounds    int            `json:"rounds_contributed"`
	Declined  int            `json:"rounds_declined"`
	PerRound  []float64      `json:"epsilon_per_round"`
	RunEps    float64        `json:"run_epsilon"` // this run's charges composed in RDP, at Delta
	Delta     float64        `json:"delta"`
	LedgerEps float64        `json:"ledger_cumulative_epsilon"` // every charge of the dataset, all runs
	Budget    float64        `json:"budget_epsilon"`
	Remaining float64        `json:"remaining_epsilon"`
	Charges   []reportCharge `json:"charges"`
}

func newPrivacyReportCmd() *cobra.Command {
	var m memberFlags
	var format string
	c := &cobra.Command{
		Use:   "report RUN [--format table|json|csv]",
		Short: "What a training run cost each silo's dataset, with the receipts that prove each charge",
		Long: `Report reads a run's round receipts from the replicated receipt chain and the
signed contribution record each receipt cites, and prints per silo and
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
			var recs []citedRecord
			cited := map[content.Ref]bool{}
			for _, r := range rs {
				if !slices.Contains(run.Jobs, r.Job) {
					continue
				}
				b, err := cl.GetBlob(ctx, r.Result)
				if err != nil {
					return fmt.Errorf("fetching the record receipt %d cites: %w", r.Seq, err)
				}
				if content.Hash(b) != r.Result {
					return fmt.Errorf("the blob of receipt %d does not hash to %s", r.Seq, r.Result.Short())
				}
				sc, err := silo.DecodeContribution(b)
				if err != nil || sc.Record.Run != id {
					continue
				}
				if err := sc.Verify(fed); err != nil {
					return diag.New(diag.ReceiptMalformed, fmt.Sprintf("receipt %d", r.Seq), "the contribution record it cites does not verify: %v", err)
				}
				recs = append(recs, citedRecord{r: r, rec: sc.Record})
				cited[r.Result] = true
			}
			// Abandoned attempts mint no receipts, but a silo that was
			// charged in one reports its record to the abandoned job all
			// the same, and a silo that reports late (from its outbox) to
			// a reduced job gets none: read those from the jobs'
			// replicated reports.
			abandoned, err := unreceiptedRecords(ctx, cl, fed, id, run.Jobs, cited)
			if err != nil {
				return err
			}
			recs = append(recs, abandoned...)
			rows, err := privacyRows(recs)
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
			fmt.Fprintf(out, "run %s (%s): %s, %d rounds, %d receipts cite its silos' records\n\n", run.Name, id.Short(), run.State, run.Rounds, len(recs))
			privacyTable(out, rows)
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "table", "table, json or csv (--json is json)")
	m.register(c)
	return c
}

// citedRecord is a contribution record and the receipt that cites it, or
// the round job it was reported to without a receipt (then r is zero).
type citedRecord struct {
	r   receipt.Receipt
	rec silo.Contribution
	// abandoned and result: the job and record hash of a record reported
	// to an abandoned attempt; late: to a job reduced without it.
	abandoned, result content.Ref
	late              bool
}

// unreceiptedRecords returns the signed contribution records that name a
// ledger charge and no receipt cites: those reported to the run's abandoned
// round jobs, and those reported late to its reduced ones. Running jobs
// are left out: their reports are not all readable yet (law 13).
func unreceiptedRecords(ctx context.Context, cl *api.Client, fed *identity.Federation, run content.Ref, jobs []content.Ref, cited map[content.Ref]bool) ([]citedRecord, error) {
	var out []citedRecord
	for _, j := range jobs {
		js, err := cl.Job(ctx, j)
		if err != nil {
			return nil, err
		}
		if js.State != coordinator.JobAbandoned && js.State != coordinator.JobDone {
			continue
		}
		for _, s := range js.Shards {
			for _, r := range s.Reports {
				if cited[r.Result] {
					continue
				}
				b, err := cl.GetBlob(ctx, r.Result)
				if err != nil || content.Hash(b) != r.Result {
					continue // never uploaded (the silo died reporting): nothing to prove
				}
				sc, err := silo.DecodeContribution(b)
				if err != nil || sc.Record.Run != run || sc.Record.LedgerEntry == "" {
					continue
				}
				if err := sc.Verify(fed); err != nil {
					return nil, diag.New(diag.ReceiptMalformed, fmt.Sprintf("job %s shard %d", j.Short(), s.Index), "the contribution record reported to it does not verify: %v", err)
				}
				out = append(out, citedRecord{rec: sc.Record, abandoned: j, result: r.Result, late: js.State == coordinator.JobDone})
			}
		}
	}
	return out, nil
}

// privacyRows groups the records by silo and dataset and composes each
// one's charges with the accountant.
func privacyRows(recs []citedRecord) ([]reportRow, error) {
	byKey := map[[2]string]*reportRow{}
	curves := map[[2]string][]float64{}
	orders := dp.DefaultOrders()
	// A charge is counted once: a retried round re-sends the update an
	// abandoned attempt paid for, and both records name the same entry.
	// Receipt-cited records come first, so they prove it when both exist.
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].abandoned == "" && recs[j].abandoned != "" })
	counted := map[content.Ref]bool{}
	for _, cr := range recs {
		rec := cr.rec
		if rec.LedgerEntry != "" {
			if counted[rec.LedgerEntry] {
				continue
			}
			counted[rec.LedgerEntry] = true
		}
		k := [2]string{rec.Silo, rec.Dataset}
		row := byKey[k]
		if row == nil {
			row = &reportRow{Silo: rec.Silo, Dataset: rec.Dataset}
			byKey[k] = row
			curves[k] = make([]float64, len(orders))
		}
		if rec.LedgerEntry == "" {
			if rec.Status == silo.Declined {
				row.Declined++
			}
			continue
		}
		row.Rounds++
		ch := reportCharge{Round: rec.Round, Status: rec.Status, Mechanisms: rec.Mechanisms, Epsilon: rec.Epsilon,
			LedgerEntry: rec.LedgerEntry, Receipt: cr.r.Seq, ReceiptHash: cr.r.Hash, Contribution: cr.r.Result}
		switch {
		case cr.late:
			ch.Status, ch.LateJob, ch.Contribution = rec.Status+" (late record)", cr.abandoned, cr.result
		case cr.abandoned != "":
			ch.Status, ch.AbandonedJob, ch.Contribution = rec.Status+" (abandoned attempt)", cr.abandoned, cr.result
		}
		row.Charges = append(row.Charges, ch)
		row.PerRound = append(row.PerRound, rec.Epsilon)
		for _, mch := range rec.Mechanisms {
			if !slices.Contains(row.Sigma, mch.Sigma) {
				row.Sigma = append(row.Sigma, mch.Sigma)
			}
			if !slices.Contains(row.Q, mch.Q) {
				row.Q = append(row.Q, mch.Q)
			}
			if row.Mechanism == "" {
				row.Mechanism = mch.Kind
			} else if !strings.Contains(row.Mechanism, mch.Kind) {
				row.Mechanism += "+" + mch.Kind
			}
			c, err := mch.RDP(orders)
			if err != nil {
				return nil, err
			}
			for i := range c {
				curves[k][i] += c[i]
			}
		}
		if rec.Delta > 0 {
			row.Delta = rec.Delta
		}
		if rec.Cumulative >= row.LedgerEps {
			row.LedgerEps, row.Budget = rec.Cumulative, rec.Budget
		}
	}
	var rows []reportRow
	for k, row := range byKey {
		if row.Rounds > 0 && row.Delta > 0 {
			eps, _, err := dp.Epsilon(orders, curves[k], row.Delta, dp.Improved)
			if err != nil {
				return nil, err
			}
			row.RunEps = eps
		}
		row.Remaining = math.Max(0, row.Budget-row.LedgerEps)
		sort.Slice(row.Charges, func(i, j int) bool { return row.Charges[i].Round < row.Charges[j].Round })
		row.PerRound = row.PerRound[:0]
		for _, ch := range row.Charges {
			row.PerRound = append(row.PerRound, ch.Epsilon)
		}
		rows = append(rows, *row)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Silo != rows[j].Silo {
			return rows[i].Silo < rows[j].Silo
		}
		return rows[i].Dataset < rows[j].Dataset
	})
	return rows, nil
}

func floats(vs []float64, sep string) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatFloat(v, 'g', 6, 64)
	}
	return strings.Join(s, sep)
}

func receiptList(cs []reportCharge, sep string) string {
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

func privacyTable(out io.Writer, rows []reportRow) {
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

func privacyCSV(out io.Writer, rows []reportRow) error {
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
