package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

func init() {
	commands = append(commands, newLedgerCmd)
}

func newLedgerCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ledger",
		Short: "Create, charge, show, verify and export a silo's privacy ledger",
		Long: `A privacy ledger is a silo's append-only, fsync'd, hash-chained and signed
record of privacy spent per dataset. Each dataset has a budget (ε, δ); a
charge that would overdraw it is refused and nothing is written. The silo
charges the ledger before an update leaves; compliance officers read and
verify it. See docs/dp.md.`,
	}
	c.AddCommand(newLedgerInitCmd(), newLedgerBudgetCmd(), newLedgerChargeCmd(),
		newLedgerShowCmd(), newLedgerVerifyCmd(), newLedgerExportCmd(), newLedgerRepairCmd())
	for _, sub := range ledgerSubcommands {
		c.AddCommand(sub())
	}
	return c
}

// ledgerSubcommands are ledger commands defined in files of their own.
var ledgerSubcommands []func() *cobra.Command

// ledgerPathFlag registers the required --ledger flag.
func ledgerPathFlag(c *cobra.Command, p *string) {
	c.Flags().StringVar(p, "ledger", "", "path of the ledger file (required)")
}

func requireLedger(p string) error {
	if p == "" {
		return usageError{errors.New("--ledger is required")}
	}
	return nil
}

// defaultKeyPath is where `ledger init` puts the silo key when --key is not
// given: next to the ledger.
func defaultKeyPath(ledger string) string { return ledger + ".key" }

func openLedger(path, key string) (*dp.Ledger, error) {
	if key == "" {
		key = defaultKeyPath(path)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, diag.New(diag.LedgerUnreadable, path, "no ledger at this path").
			WithHelp("create one with `scellis ledger init --ledger %s`", path)
	}
	priv, err := dp.ReadPrivateKeyFile(key)
	if err != nil {
		return nil, err
	}
	return dp.Open(path, priv, nil)
}

func newLedgerInitCmd() *cobra.Command {
	var path, key, delta, orders, conv, silo string
	var budgets []string
	c := &cobra.Command{
		Use:   "init --ledger PATH [--budget NAME=EPS --delta D]...",
		Short: "Create a privacy ledger (and the silo key, if it has none)",
		Long: `Init creates a new ledger signed by the silo's Ed25519 key. Without --key the
key is PATH.key; a key file that does not exist yet is generated (PEM PKCS#8,
mode 0600). The public key is written to PATH.pub for verification. The
order grid and the RDP conversion are fixed in the ledger's first entry.`,
		Example: `  scellis ledger init --ledger /var/lib/scellis/privacy.ledger --budget icu-2024=8 --delta 1e-5`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			o, err := parseOrders(orders)
			if err != nil {
				return err
			}
			cv, err := dp.ParseConversion(conv)
			if err != nil {
				return err
			}
			type budget struct {
				name string
				eps  float64
			}
			var bs []budget
			var d float64
			if len(budgets) > 0 {
				if d, err = requireFloat(cmd, "delta", delta, diag.DPBadDelta); err != nil {
					return err
				}
			}
			for _, b := range budgets {
				name, e, ok := strings.Cut(b, "=")
				if !ok {
					return diag.New(diag.InvalidValue, "budget", "--budget %q is not NAME=EPSILON", b).
						WithHelp("for example --budget icu-2024=8 --delta 1e-5")
				}
				v, derr := parseNumber("budget", e, diag.DPBadEpsilon)
				if derr != nil {
					return derr
				}
				if err := dp.ValidateBudget(name, v, d); err != nil {
					return err
				}
				for _, prev := range bs {
					if prev.name == name {
						return diag.New(diag.LedgerBudgetExists, "dataset "+name, "--budget %s is given twice", name)
					}
				}
				bs = append(bs, budget{name, v})
			}
			if _, err := os.Lstat(path); err == nil {
				return diag.New(diag.LedgerExists, path, "a file already exists at the ledger path").
					WithHelp("a ledger is never overwritten; choose another path")
			}
			if key == "" {
				key = defaultKeyPath(path)
			}
			priv, created, err := loadOrCreateKey(key)
			if err != nil {
				return err
			}
			pub := priv.Public().(ed25519.PublicKey)
			if err := dp.WritePublicKeyFile(path+".pub", pub); err != nil {
				return err
			}
			l, err := dp.Create(path, priv, &dp.Options{Orders: o, Conversion: cv, Silo: silo})
			if err != nil {
				return err
			}
			defer l.Close()
			out := cmd.OutOrStdout()
			verb := "using"
			if created {
				verb = "generated"
			}
			fmt.Fprintf(out, "created ledger %s\n", path)
			fmt.Fprintf(out, "%s silo key %s (public key %s in %s)\n", verb, key, dp.PublicKeyString(pub), path+".pub")
			for _, b := range bs {
				if _, err := l.DeclareBudget(b.name, b.eps, d); err != nil {
					return err
				}
				fmt.Fprintf(out, "budget %s: ε = %g at δ = %g\n", b.name, b.eps, d)
			}
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&key, "key", "", "silo Ed25519 key file (PEM PKCS#8); generated if missing (default PATH.key)")
	c.Flags().StringArrayVar(&budgets, "budget", nil, "declare a dataset budget NAME=EPSILON (repeatable; needs --delta)")
	c.Flags().StringVar(&delta, "delta", "", "δ of the budgets declared with --budget, in (0, 1)")
	c.Flags().StringVar(&orders, "orders", "default", "Rényi orders of the ledger: numbers, A:B or A:B:STEP ranges, comma-separated")
	c.Flags().StringVar(&conv, "conversion", "improved", "RDP to (ε, δ) conversion: improved or classic")
	c.Flags().StringVar(&silo, "silo", "", "name of the silo, recorded in the ledger's first entry")
	return c
}

// loadOrCreateKey reads the key at path, or generates it if the file does
// not exist.
func loadOrCreateKey(path string) (ed25519.PrivateKey, bool, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		k, err := dp.GenerateKeyFile(path)
		return k, true, err
	}
	k, err := dp.ReadPrivateKeyFile(path)
	return k, false, err
}

func newLedgerBudgetCmd() *cobra.Command {
	var path, key, dataset, eps, delta string
	c := &cobra.Command{
		Use:   "budget --ledger PATH --dataset NAME --epsilon E --delta D",
		Short: "Declare a dataset's privacy budget (once per dataset)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			if dataset == "" {
				return usageError{errors.New("--dataset is required")}
			}
			e, err := requireFloat(cmd, "epsilon", eps, diag.DPBadEpsilon)
			if err != nil {
				return err
			}
			d, err := requireFloat(cmd, "delta", delta, diag.DPBadDelta)
			if err != nil {
				return err
			}
			l, err := openLedger(path, key)
			if err != nil {
				return err
			}
			defer l.Close()
			ent, err := l.DeclareBudget(dataset, e, d)
			if err != nil {
				return err
			}
			if jsonOutput {
				return writeJSON(cmd.OutOrStdout(), ent)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "budget %s: ε = %g at δ = %g (entry %d)\n", dataset, e, d, ent.Seq)
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&key, "key", "", "silo key file (default PATH.key)")
	c.Flags().StringVar(&dataset, "dataset", "", "dataset name (required)")
	c.Flags().StringVar(&eps, "epsilon", "", "the dataset's total ε budget (required)")
	c.Flags().StringVar(&delta, "delta", "", "the dataset's δ, in (0, 1) (required)")
	return c
}

// chargeLine is what `ledger charge` prints per accepted charge (one JSON
// object per line with --json).
type chargeLine struct {
	Seq        uint64         `json:"seq"`
	Dataset    string         `json:"dataset"`
	Consumer   string         `json:"consumer"`
	Epsilon    float64        `json:"epsilon"`
	Cumulative float64        `json:"cumulative_epsilon"`
	Remaining  float64        `json:"remaining_epsilon"`
	Mechanisms []dp.Mechanism `json:"mechanisms"`
	Hash       content.Ref    `json:"hash"`
}

func newLedgerChargeCmd() *cobra.Command {
	var path, key, dataset, consumer string
	var repeat int
	var mf mechanismFlags
	c := &cobra.Command{
		Use:   "charge --ledger PATH --dataset NAME --consumer ID --sigma S --q Q --steps T",
		Short: "Charge a dataset's budget by hand (drills and tests)",
		Long: `Charge computes the privacy cost of the given mechanisms with the accountant,
composes it with the dataset's earlier charges and appends a signed entry,
fsync'd before the command reports it. A charge that would overdraw the
budget is refused (exit 2) and nothing is written. The silo appliance charges
through the same code. --repeat N charges N times in one process, printing
each charge once it is durable (for drills).`,
		Example: `  scellis ledger charge --ledger privacy.ledger --dataset icu-2024 --consumer round-17 --sigma 1.1 --q 0.01 --steps 500`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			if dataset == "" || consumer == "" {
				return usageError{errors.New("--dataset and --consumer are required")}
			}
			if repeat < 1 {
				return usageError{errors.New("--repeat must be at least 1")}
			}
			ms, err := mf.parse()
			if err != nil {
				return err
			}
			l, err := openLedger(path, key)
			if err != nil {
				return err
			}
			defer l.Close()
			out := cmd.OutOrStdout()
			for _, t := range l.TornTails() {
				fmt.Fprintf(cmd.ErrOrStderr(), "scellis: note: cut a torn last write: %s\n", t)
			}
			for range repeat {
				e, err := l.Charge(dp.ChargeRequest{Dataset: dataset, Consumer: consumer, Mechanisms: ms})
				if err != nil {
					return err
				}
				st, err := l.Status(dataset)
				if err != nil {
					return err
				}
				line := chargeLine{Seq: e.Seq, Dataset: dataset, Consumer: consumer, Epsilon: e.Charge.Epsilon,
					Cumulative: e.Charge.Cumulative, Remaining: st.Budget - e.Charge.Cumulative, Mechanisms: ms, Hash: e.Hash}
				if jsonOutput {
					b, _ := jsonLine(line)
					fmt.Fprintln(out, b)
				} else {
					fmt.Fprintf(out, "charged entry %d: %s for %s, ε = %.6g, cumulative ε = %.6g of %g, remaining %.6g (hash %s)\n",
						e.Seq, dataset, consumer, line.Epsilon, line.Cumulative, st.Budget, line.Remaining, e.Hash)
				}
			}
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&key, "key", "", "silo key file (default PATH.key)")
	c.Flags().StringVar(&dataset, "dataset", "", "dataset to charge (required)")
	c.Flags().StringVar(&consumer, "consumer", "", "job or round ID the privacy is spent on (required)")
	c.Flags().IntVar(&repeat, "repeat", 1, "charge this many times, one entry each")
	flagRange(c, "repeat", "1", "1000000")
	mf.register(c)
	return c
}

func jsonLine(v any) (string, error) {
	var b strings.Builder
	if err := writeJSONCompact(&b, v); err != nil {
		return "", err
	}
	return strings.TrimRight(b.String(), "\n"), nil
}

// verifiedSnapshot reads and verifies a ledger for show and export; a broken
// ledger is refused (SC5014, exit 2) pointing at `ledger verify`.
func verifiedSnapshot(path string) (*dp.Snapshot, error) {
	s, err := dp.Verify(path, nil)
	var ve *dp.VerifyError
	if errors.As(err, &ve) {
		return nil, corruptDiag(path, ve)
	}
	return s, err
}

// corruptDiag is the refusal of a ledger that fails verification: the first
// bad entry and its byte offset, and the way back.
func corruptDiag(path string, ve *dp.VerifyError) *diag.Diagnostic {
	where := fmt.Sprintf("entry %d (byte %d)", ve.Seq, ve.Offset)
	if ve.Offset < 0 {
		where = fmt.Sprintf("entry %d", ve.Seq)
	}
	return diag.New(diag.LedgerCorrupt, path, "ledger fails verification at %s: %s", where, ve.Reason).
		WithHelp("the ledger is fenced: no charge is written until an operator restores it; see docs/dp.md, \"A damaged ledger\" (keep this file aside, restore the last good copy, check it with `scellis ledger audit`)")
}

// showRow is one charge in `ledger show`.
type showRow struct {
	Seq        uint64         `json:"seq"`
	Time       string         `json:"time"`
	Dataset    string         `json:"dataset"`
	Consumer   string         `json:"consumer"`
	Mechanisms []dp.Mechanism `json:"mechanisms"`
	Epsilon    float64        `json:"epsilon"`
	Cumulative float64        `json:"cumulative_epsilon"`
	Remaining  float64        `json:"remaining_epsilon"`
	Hash       content.Ref    `json:"hash"`
}

func chargeRows(s *dp.Snapshot, dataset string) []showRow {
	budgets := map[string]float64{}
	var rows []showRow
	for _, e := range s.Entries() {
		switch {
		case e.Budget != nil:
			budgets[e.Budget.Dataset] = e.Budget.Epsilon
		case e.Charge != nil:
			ch := e.Charge
			if dataset != "" && ch.Dataset != dataset {
				continue
			}
			rows = append(rows, showRow{
				Seq: e.Seq, Time: e.At().Format(time.RFC3339), Dataset: ch.Dataset, Consumer: ch.Consumer,
				Mechanisms: ch.Mechanisms, Epsilon: ch.Epsilon, Cumulative: ch.Cumulative,
				Remaining: budgets[ch.Dataset] - ch.Cumulative, Hash: e.Hash,
			})
		}
	}
	return rows
}

func mechString(ms []dp.Mechanism) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("σ=%g q=%g T=%d", m.Sigma, m.Q, m.Steps)
	}
	return strings.Join(parts, " + ")
}

func newLedgerShowCmd() *cobra.Command {
	var path, dataset string
	c := &cobra.Command{
		Use:   "show --ledger PATH [--dataset NAME]",
		Short: "Show the charges and each dataset's spent and remaining budget",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			s, err := verifiedSnapshot(path)
			if err != nil {
				return err
			}
			var sums []dp.DatasetStatus
			if dataset != "" {
				st, ok := s.Dataset(dataset)
				if !ok {
					return diag.New(diag.LedgerNoBudget, "dataset "+dataset, "dataset %q has no budget in this ledger", dataset)
				}
				sums = []dp.DatasetStatus{st}
			} else {
				sums = s.Datasets()
			}
			rows := chargeRows(s, dataset)
			out := cmd.OutOrStdout()
			if jsonOutput {
				if rows == nil {
					rows = []showRow{}
				}
				return writeJSON(out, map[string]any{
					"ledger": path, "public_key": dp.PublicKeyString(s.PublicKey()), "silo": s.Silo(),
					"head": s.Head(), "entries": s.Len(), "conversion": s.Conversion().String(),
					"charges": rows, "datasets": sums,
				})
			}
			fmt.Fprintf(out, "ledger %s: %d entries, signed by %s, head %s\n\n", path, s.Len(), dp.PublicKeyString(s.PublicKey()), s.Head().Short())
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tWHEN (UTC)\tDATASET\tCONSUMER\tMECHANISM\tε\tCUMULATIVE ε\tREMAINING ε")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%.4g\t%.4g\t%.4g\n", r.Seq, r.Time, r.Dataset, r.Consumer, mechString(r.Mechanisms), r.Epsilon, r.Cumulative, r.Remaining)
			}
			if len(rows) == 0 {
				fmt.Fprintln(tw, "(no charges)")
			}
			tw.Flush()
			fmt.Fprintln(out)
			tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "DATASET\tBUDGET ε\tδ\tSPENT ε\tREMAINING ε\tCHARGES")
			for _, d := range sums {
				fmt.Fprintf(tw, "%s\t%g\t%g\t%.4g\t%.4g\t%d\n", d.Dataset, d.Budget, d.Delta, d.Spent, d.Remaining, d.Charges)
			}
			tw.Flush()
			if s.TornBytes > 0 {
				fmt.Fprintf(out, "\nnote: %d bytes of a torn last write follow the last complete entry; the next charge cuts them\n", s.TornBytes)
			}
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&dataset, "dataset", "", "show only this dataset")
	return c
}

func newLedgerVerifyCmd() *cobra.Command {
	var path, pubkey, head string
	c := &cobra.Command{
		Use:   "verify --ledger PATH [--pubkey KEY] [--head HASH]",
		Short: "Check the ledger's hash chain, signatures and budgets",
		Long: `Verify checks every entry: framing, canonical encoding, hash, link to the
previous entry, sequence number, Ed25519 signature, and that each charge's RDP
curve and cumulative ε follow from its mechanism and stay within budget.
It exits 0 when the ledger is intact, and 2 with SC5014 naming the first bad
entry and its byte offset otherwise. Only a final frame that is shorter than
its length field and holds no complete entry counts as a torn write (a
crash); anything else is corruption, and charges are refused until an
operator restores the ledger (docs/dp.md, "A damaged ledger").

Without --pubkey, verify proves the ledger is consistent in itself, not who
wrote it: give the silo's public key (a .pub or .key file, or ed25519:BASE64)
to rule out a ledger rewritten and re-signed with another key. Removing the
last entries leaves a consistent ledger; give a head hash recorded earlier
(--head) to detect that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			var pub ed25519.PublicKey
			if pubkey != "" {
				var err error
				if pub, err = readPubkeyArg(pubkey); err != nil {
					return err
				}
			}
			if head != "" && !content.IsRef(head) {
				return diag.New(diag.InvalidValue, "head", "--head %q is not a hash (sha256:<64 hex digits>)", head)
			}
			s, err := dp.Verify(path, pub)
			var ve *dp.VerifyError
			if err != nil && !errors.As(err, &ve) {
				return err
			}
			if ve == nil && head != "" {
				if _, ok := s.Find(content.Ref(head)); !ok {
					ve = &dp.VerifyError{Seq: uint64(s.Len()), Offset: -1,
						Reason: fmt.Sprintf("the anchored head %s is not in the ledger: entries were removed", content.Ref(head).Short())}
				}
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				res := map[string]any{"ledger": path, "intact": ve == nil, "entries": s.Len(),
					"head": s.Head(), "public_key": dp.PublicKeyString(s.PublicKey()), "key_checked": pub != nil, "torn_bytes": s.TornBytes}
				if ve != nil {
					res["bad_entry"] = map[string]any{"seq": ve.Seq, "offset": ve.Offset, "reason": ve.Reason}
				}
				if err := writeJSON(out, res); err != nil {
					return err
				}
			}
			if ve != nil {
				return corruptDiag(path, ve)
			}
			if !jsonOutput {
				fmt.Fprintf(out, "ledger %s is intact: %d entries, head %s\n", path, s.Len(), s.Head())
				if pub != nil {
					fmt.Fprintf(out, "every entry is signed by the expected key %s\n", dp.PublicKeyString(pub))
				} else {
					fmt.Fprintf(out, "entries are signed by %s (not checked against a trusted key: give --pubkey)\n", dp.PublicKeyString(s.PublicKey()))
				}
				if s.TornBytes > 0 {
					fmt.Fprintf(out, "note: %d bytes of a torn last write follow the last complete entry (a crash mid-write); the next charge cuts them\n", s.TornBytes)
				}
			}
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&pubkey, "pubkey", "", "expected silo public key: a PEM file (.pub or .key) or ed25519:BASE64")
	c.Flags().StringVar(&head, "head", "", "a head hash recorded earlier that must still be in the ledger")
	return c
}

func readPubkeyArg(s string) (ed25519.PublicKey, error) {
	if strings.HasPrefix(s, "ed25519:") {
		pub, err := dp.ParsePublicKey(s)
		if err != nil {
			return nil, diag.New(diag.LedgerKeyFile, "pubkey", "%v", err)
		}
		return pub, nil
	}
	return dp.ReadPublicKeyFile(s)
}

func newLedgerExportCmd() *cobra.Command {
	var path, format, output string
	c := &cobra.Command{
		Use:   "export --ledger PATH --format csv|json",
		Short: "Export every verified entry as CSV or JSON",
		Long: `Export writes every entry of a verified ledger. JSON holds the entries in
full (RDP curves, hashes, signatures); CSV holds one row per entry for
spreadsheets. Text fields that a spreadsheet would read as a formula are
prefixed with a single quote.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			if format != "csv" && format != "json" {
				return diag.New(diag.InvalidValue, "format", "unknown export format %q", format).WithHelp("use csv or json")
			}
			s, err := verifiedSnapshot(path)
			if err != nil {
				return err
			}
			var w io.Writer = cmd.OutOrStdout()
			if output != "" {
				f, err := os.OpenFile(output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return diag.New(diag.FileUnreadable, output, "cannot create the export file: %v", err).
						WithHelp("exports never overwrite a file; choose a new name")
				}
				defer f.Close()
				w = f
			}
			if format == "json" {
				type jsonEntry struct {
					dp.Entry
					When string `json:"time"`
				}
				var es []jsonEntry
				for _, e := range s.Entries() {
					es = append(es, jsonEntry{e, e.At().Format(time.RFC3339Nano)})
				}
				return writeJSON(w, map[string]any{"ledger": path, "head": s.Head(),
					"public_key": dp.PublicKeyString(s.PublicKey()), "entries": es})
			}
			return exportCSV(w, s)
		},
	}
	ledgerPathFlag(c, &path)
	c.Flags().StringVar(&format, "format", "", "csv or json (required)")
	c.Flags().StringVar(&output, "output", "", "write to this new file instead of standard output")
	return c
}

// csvText neutralises spreadsheet formula injection in a text field.
func csvText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

func exportCSV(w io.Writer, s *dp.Snapshot) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"seq", "time", "kind", "dataset", "consumer", "mechanisms", "epsilon", "cumulative_epsilon",
		"budget_epsilon", "delta", "remaining_epsilon", "order", "prev", "hash", "signature"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	budgets := map[string]dp.Budget{}
	for _, e := range s.Entries() {
		row := []string{strconv.FormatUint(e.Seq, 10), e.At().Format(time.RFC3339Nano), string(e.Kind)}
		switch {
		case e.Genesis != nil:
			row = append(row, "", "", "", "", "", "", "", "", "")
		case e.Budget != nil:
			budgets[e.Budget.Dataset] = *e.Budget
			row = append(row, csvText(e.Budget.Dataset), "", "", "", "", f(e.Budget.Epsilon), f(e.Budget.Delta), f(e.Budget.Epsilon), "")
		case e.Charge != nil:
			ch, b := e.Charge, budgets[e.Charge.Dataset]
			row = append(row, csvText(ch.Dataset), csvText(ch.Consumer), mechString(ch.Mechanisms), f(ch.Epsilon), f(ch.Cumulative),
				f(b.Epsilon), f(b.Delta), f(b.Epsilon-ch.Cumulative), f(ch.Order))
		}
		row = append(row, string(e.Prev), string(e.Hash), base64.StdEncoding.EncodeToString(e.Sig))
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

func newLedgerRepairCmd() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:   "repair --ledger PATH",
		Short: "Rewrite damaged framing around intact entries (operators, on a fenced ledger)",
		Long: `Repair fixes a ledger that fails verification only because of its framing —
a damaged length field, length checksum or frame CRC — when every entry is
still intact: each damaged frame must hold, right after its header, a complete
entry whose hash, signature and budget arithmetic verify and that extends the
chain. Those bytes are re-framed as they were written, so no signed entry is
dropped and spent ε never decreases. The damaged file is kept as
PATH.damaged-UNIXNANO and the repaired one replaces it atomically.

Damage inside an entry is refused (SC5014, exit 2): restore the ledger from a
copy instead and check it against the receipt chain with 'scellis ledger
audit' (docs/dp.md, "A damaged ledger"). Stop the silo before repairing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireLedger(path); err != nil {
				return err
			}
			r, err := dp.Repair(path, time.Now())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				return writeJSON(out, map[string]any{"ledger": path, "reframed_offsets": r.Reframed, "saved_as": r.SavedAs, "entries": r.Entries})
			}
			if len(r.Reframed) == 0 {
				fmt.Fprintf(out, "ledger %s: no damaged framing to repair (%d entries)\n", path, r.Entries)
				return nil
			}
			for _, off := range r.Reframed {
				fmt.Fprintf(out, "re-framed the entry at byte %d\n", off)
			}
			fmt.Fprintf(out, "ledger %s repaired: %d entries; the damaged file is kept as %s\n", path, r.Entries, r.SavedAs)
			return nil
		},
	}
	ledgerPathFlag(c, &path)
	return c
}
