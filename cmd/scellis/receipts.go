package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/receipt"
)

func init() { commands = append(commands, newReceiptsCmd) }

func newReceiptsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "receipts",
		Short: "Read, verify and export the pool's hash-chained receipts",
		Long: `Every verified shard mints a receipt in a hash chain replicated by the
aggregator cluster: job, shard, canonical result hash, agreeing peers, the
verification method, and the work units the planner priced before execution.`,
	}
	cmd.AddCommand(newReceiptsShowCmd(), newReceiptsVerifyCmd(), newReceiptsContribCmd(), newReceiptsExportCmd())
	return cmd
}

// receiptSource is where receipts come from: the pool, or an exported file.
type receiptSource struct {
	memberFlags
	file string
}

func (s *receiptSource) register(cmd *cobra.Command) {
	s.memberFlags.register(cmd)
	cmd.Flags().StringVar(&s.file, "file", "", "read receipts from a file made by 'scellis receipts export --format json' instead of the pool")
}

func (s *receiptSource) load(cmd *cobra.Command) ([]receipt.Receipt, error) {
	if s.file != "" {
		b, err := safefile.ReadFile(s.file, safefile.MaxLedger)
		if err != nil {
			return nil, diag.New(diag.FileUnreadable, s.file, "cannot read the receipt file: %v", configPathErr(err)).
				WithHelp("give the file 'scellis receipts export --format json' wrote")
		}
		var rs []receipt.Receipt
		if err := json.Unmarshal(b, &rs); err != nil {
			return nil, diag.New(diag.ReceiptMalformed, s.file, "not a receipt export: %v", err).
				WithHelp("export with scellis receipts export --format json")
		}
		return rs, nil
	}
	c, _, err := s.client(cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
	defer cancel()
	return c.Receipts(ctx, 0)
}

func newReceiptsShowCmd() *cobra.Command {
	var s receiptSource
	var jobFilter string
	cmd := &cobra.Command{
		Use:   "show",
		Short: "List receipts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := s.load(cmd)
			if err != nil {
				return err
			}
			var out []receipt.Receipt
			for _, r := range rs {
				if jobFilter == "" || strings.Contains(string(r.Job), jobFilter) {
					out = append(out, r)
				}
			}
			if jsonOutput {
				b, _ := json.MarshalIndent(out, "", "  ")
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%5s  %-12s %-12s %5s  %-12s %5s  %-16s %s\n", "seq", "receipt", "job", "shard", "result", "units", "method", "peers")
			for _, r := range out {
				fmt.Fprintf(w, "%5d  %-12s %-12s %5d  %-12s %5d  %-16s %s\n", r.Seq, r.Hash.Short(), r.Job.Short(), r.ShardIndex,
					r.Result.Short(), r.WorkUnits, r.Method, strings.Join(r.Peers, ","))
			}
			return nil
		},
	}
	s.register(cmd)
	cmd.Flags().StringVar(&jobFilter, "job", "", "only receipts of this job (ID or a prefix of it)")
	return cmd
}

func newReceiptsVerifyCmd() *cobra.Command {
	var s receiptSource
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check the receipt chain: links, hashes, no gap, no duplicate",
		Long:  "Exit 0 when the chain is intact; exit 1 naming the first bad receipt otherwise.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := s.load(cmd)
			if err != nil {
				return err
			}
			if err := receipt.Verify(rs); err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("receipt chain broken: %v", err)}
			}
			head := receipt.Genesis
			if len(rs) > 0 {
				head = rs[len(rs)-1].Hash
			}
			if jsonOutput {
				b, _ := json.Marshal(map[string]any{"intact": true, "receipts": len(rs), "head": head})
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "receipt chain intact: %d receipts, head %s\n", len(rs), head)
			return nil
		},
	}
	s.register(cmd)
	return cmd
}

func newReceiptsContribCmd() *cobra.Command {
	var s receiptSource
	cmd := &cobra.Command{
		Use:   "contributions",
		Short: "Verified work units per peer, summed from the receipts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := s.load(cmd)
			if err != nil {
				return err
			}
			if err := receipt.Verify(rs); err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("receipt chain broken, contributions not computed: %v", err)}
			}
			c := receipt.Contributions(rs)
			if jsonOutput {
				b, _ := json.MarshalIndent(c, "", "  ")
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			peers := make([]string, 0, len(c))
			for p := range c {
				peers = append(peers, p)
			}
			sort.Strings(peers)
			var total int64
			for _, p := range peers {
				fmt.Fprintf(cmd.OutOrStdout(), "%-20s %8d work units\n", p, c[p])
				total += c[p]
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%-20s %8d work units (each agreeing peer is credited the shard's price)\n", "total", total)
			return nil
		},
	}
	s.register(cmd)
	return cmd
}

func newReceiptsExportCmd() *cobra.Command {
	var s receiptSource
	var format string
	cmd := &cobra.Command{
		Use:   "export --format json|csv",
		Short: "Write every receipt to stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "json" && format != "csv" {
				return diag.New(diag.InvalidValue, "--format", "unknown format %q", format).WithHelp("use json or csv")
			}
			rs, err := s.load(cmd)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if format == "json" {
				b, _ := json.MarshalIndent(rs, "", "  ")
				printJSON(w, b)
				return nil
			}
			cw := csv.NewWriter(w)
			cw.Write([]string{"seq", "hash", "prev", "job", "shard_index", "shard", "result", "peers", "method", "work_units", "price_basis", "leader_time"})
			for _, r := range rs {
				cw.Write([]string{fmt.Sprint(r.Seq), string(r.Hash), string(r.Prev), string(r.Job), fmt.Sprint(r.ShardIndex), string(r.Shard),
					string(r.Result), strings.Join(r.Peers, ";"), r.Method, fmt.Sprint(r.WorkUnits), r.PriceBasis,
					time.UnixMilli(r.LeaderTime).UTC().Format(time.RFC3339Nano)})
			}
			cw.Flush()
			return cw.Error()
		},
	}
	s.register(cmd)
	cmd.Flags().StringVar(&format, "format", "json", "json or csv")
	return cmd
}
