package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/silo"
)

func init() { ledgerSubcommands = append(ledgerSubcommands, newLedgerAuditCmd) }

func newLedgerAuditCmd() *cobra.Command {
	var path, receipts, contributions, siloName, pubkey string
	var m memberFlags
	c := &cobra.Command{
		Use:   "audit LEDGER [--receipts FILE] [--contributions DIR]",
		Short: "Check a silo's ledger against the receipt chain (truncation, rollback, replacement)",
		Long: `Audit checks a ledger against the replicated receipt chain. Every contribution
record a silo reports for a round names the ledger entry that paid for it and
the ledger's head (sequence number and hash) when it was signed; the round's
receipt cites the record by hash, so the chain anchors the silo's ledger.
Audit verifies the ledger and the chain, then, for every receipt of the silo
whose result is its signed contribution record, checks that the ledger holds
that charge (same run, round, dataset, mechanisms and ε) and that its entry at
the anchored sequence number is the anchored head. A ledger that was
truncated, rolled back to an older copy or replaced fails (SC5042, exit 2);
one that only grew since passes.

Receipts come from the pool (as a member: --identity, --federation) or from
a 'scellis receipts export --format json' file (--receipts). Contribution
records are fetched from the pool by hash, or read from a folder of blobs
(--contributions; every file is hashed, names do not matter).`,
		Example: `  scellis ledger audit /var/lib/scellis/privacy.ledger
  scellis ledger audit privacy.ledger --receipts receipts.json --contributions blobs/`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if path != "" && path != args[0] {
					return usageError{fmt.Errorf("give the ledger once (LEDGER or --ledger)")}
				}
				path = args[0]
			}
			if err := requireLedger(path); err != nil {
				return usageError{fmt.Errorf("give the ledger: scellis ledger audit LEDGER")}
			}
			var pub ed25519.PublicKey
			if pubkey != "" {
				var err error
				if pub, err = readPubkeyArg(pubkey); err != nil {
					return err
				}
			}
			snap, err := dp.Verify(path, pub)
			if err != nil {
				if ve, ok := err.(*dp.VerifyError); ok {
					return corruptDiag(path, ve)
				}
				return err
			}
			if siloName == "" {
				siloName = snap.Silo()
			}
			if siloName == "" {
				return diag.New(diag.InvalidValue, "silo", "the ledger does not name its silo").WithHelp("give the silo's member name with --silo")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			src := receiptSource{memberFlags: m, file: receipts}
			rs, err := src.load(cmd)
			if err != nil {
				return err
			}
			fetch, err := contributionFetcher(ctx, cmd, m, contributions)
			if err != nil {
				return err
			}
			a, err := silo.AuditLedger(snap, siloName, rs, fetch)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				if err := writeJSON(out, a); err != nil {
					return err
				}
			} else {
				printAudit(out, path, a)
			}
			if p := a.Problems(); len(p) > 0 {
				return diag.New(diag.LedgerAuditFailed, path, "the ledger disagrees with the receipt chain at %d anchored entries; the first: receipt %d: %s", len(p), p[0].Receipt, p[0].Problem).
					WithHelp("do not charge this ledger: restore a copy that passes `scellis ledger audit` (docs/dp.md, \"A damaged ledger\")")
			}
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&receipts, "receipts", "", "a receipt export (scellis receipts export --format json) instead of the pool's chain")
	c.Flags().StringVar(&contributions, "contributions", "", "a folder of contribution blobs instead of fetching them from the pool")
	c.Flags().StringVar(&siloName, "silo", "", "the silo's member name (default: the name in the ledger's first entry)")
	c.Flags().StringVar(&pubkey, "pubkey", "", "expected silo public key: a PEM file (.pub or .key) or ed25519:BASE64")
	m.register(c)
	return c
}

// contributionFetcher returns how to read a result blob by hash: from the
// files of dir, or from the pool.
func contributionFetcher(ctx context.Context, cmd *cobra.Command, m memberFlags, dir string) (func(content.Ref) ([]byte, error), error) {
	if dir == "" {
		c, _, err := m.client(cmd.ErrOrStderr())
		if err != nil {
			return nil, err
		}
		return func(r content.Ref) ([]byte, error) { return c.GetBlob(ctx, r) }, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, diag.New(diag.FileUnreadable, dir, "cannot read the contributions folder: %v", err)
	}
	blobs := map[content.Ref][]byte{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := safefile.ReadFile(filepath.Join(dir, e.Name()), safefile.MaxLedger)
		if err != nil {
			return nil, err
		}
		blobs[content.Hash(b)] = b
	}
	return func(r content.Ref) ([]byte, error) {
		if b, ok := blobs[r]; ok {
			return b, nil
		}
		return nil, fmt.Errorf("blob %s is not in %s", r.Short(), dir)
	}, nil
}

func printAudit(out interface{ Write([]byte) (int, error) }, path string, a *silo.Audit) {
	fmt.Fprintf(out, "ledger %s (silo %s): %d entries, head %s\n", path, a.Silo, a.Entries, a.Head.Short())
	fmt.Fprintf(out, "receipt chain: %d receipts, %d of them cite contribution records of %s\n\n", a.Receipts, a.Contributions, a.Silo)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RECEIPT\tRUN\tROUND\tANCHOR\tSEQ\tENTRY\tLEDGER")
	for _, x := range a.Anchors {
		verdict := "ok"
		if x.Problem != "" {
			verdict = "MISMATCH: " + x.Problem
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%s\t%s\n", x.Receipt, x.Run.Short(), x.Round, x.Kind, x.Seq, x.Entry.Short(), verdict)
	}
	tw.Flush()
	if len(a.Unavailable) > 0 {
		s := make([]string, len(a.Unavailable))
		for i, r := range a.Unavailable {
			s[i] = fmt.Sprint(r)
		}
		fmt.Fprintf(out, "\nnote: the results of receipts %s could not be fetched and were not checked\n", strings.Join(s, ", "))
	}
	if len(a.Problems()) == 0 {
		fmt.Fprintf(out, "\nthe ledger agrees with the receipt chain: every anchored entry (up to entry %d) is in it\n", a.Highest)
	}
}
