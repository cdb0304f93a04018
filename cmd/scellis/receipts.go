package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/memlimit"
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
		return readReceiptExport(s.file)
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
	var wantHead string
	var children []string
	cmd := &cobra.Command{
		Use:   "verify [--head HASH] [--child NAME=FEDERATION]...",
		Short: "Check the receipt chain: links, hashes, no gap, no duplicate",
		Long: `Verify checks every receipt: its hash, its link to the receipt before,
its sequence number (no gap, duplicate or reordering) and its form. It exits
0 when the chain is intact, and 2 with SC7013 naming the first bad receipt
otherwise (with --json the verdict is printed either way). A file from
'scellis receipts export --format json' is decoded strictly: unknown keys,
keys in another case and repeated keys are SC7014.

A chain whose last receipts were removed is still consistent: give a head
hash recorded earlier (--head, e.g. from 'scellis aggregator status') to
detect that; the chain must hold that receipt.

With a federation file (--federation, $SCELLIS_FEDERATION or
$SCELLIS_HOME/federation.yaml) it also checks, offline, that every
receipt carries a valid signature of its result by each peer it credits,
made with that peer's key in the file; a missing, foreign or forged
signature is SC7306. Without one it says the signatures were not checked.

In a tree of clusters (docs/tree.md) a parent's receipts of shards a child
cluster computed cite the child chain's head. Verify then walks the tree:
for each cited child give --child NAME=FEDERATION (the child's federation
file: its chain is fetched from its aggregators, as this member) or
--child NAME=EXPORT.json; the child's chain must verify, hold each cited
head, and hold a receipt of the same shard and result at or before it.
A child not given, unreachable, or whose chain does not hold what the
parent recorded is SC7603.`,
		Example: `  scellis receipts verify
  scellis receipts verify --file receipts.json --head sha256:4f1c…
  scellis receipts verify --child eu=eu/federation.yaml --child us=us-receipts.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wantHead != "" && !content.IsRef(wantHead) {
				return diag.New(diag.InvalidValue, "head", "--head %q is not a hash (sha256:<64 hex digits>)", wantHead)
			}
			sources, err := childSources(children)
			if err != nil {
				return err
			}
			rs, err := s.load(cmd)
			if err != nil {
				return err
			}
			var bad *diag.Diagnostic
			var brk *receipt.Break
			if err := receipt.Verify(rs); err != nil {
				if !errors.As(err, &brk) {
					return err
				}
				bad = brk.Diagnostic()
			}
			head := receipt.Genesis
			if len(rs) > 0 {
				head = rs[len(rs)-1].Hash
			}
			after := -1 // receipts after the given head
			if bad == nil && wantHead != "" {
				if content.Ref(wantHead) == receipt.Genesis {
					after = len(rs)
				}
				for i, r := range rs {
					if r.Hash == content.Ref(wantHead) {
						after = len(rs) - 1 - i
					}
				}
				if after < 0 {
					bad = diag.New(diag.ReceiptChainBroken, "head", "the chain of %d receipts (head %s) does not hold the given head %s: receipts were removed from its end, or it is another chain",
						len(rs), head.Short(), content.Ref(wantHead).Short()).
						WithHelp("compare with another aggregator node's copy; the given head was recorded from a longer chain")
				}
			}
			fedPath, sigsChecked := "", false
			if bad == nil {
				var sigBad *diag.Diagnostic
				var err error
				fedPath, sigBad, err = s.checkSignatures(rs)
				if err != nil {
					return err
				}
				sigsChecked, bad = fedPath != "", sigBad
			}
			var walked []string
			if bad == nil && len(citedChildren(rs)) > 0 {
				var err error
				walked, bad, err = treeWalk(rs, sources, func(name, path string) ([]receipt.Receipt, error) {
					return s.loadChildChain(cmd.Context(), name, path)
				})
				if err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				res := map[string]any{"intact": bad == nil, "receipts": len(rs), "head": head, "signatures_checked": sigsChecked}
				if len(walked) > 0 {
					res["children"] = walked
				}
				if wantHead != "" {
					res["given_head"] = wantHead
					res["holds_given_head"] = after >= 0
				}
				if bad != nil {
					v := map[string]any{"code": bad.Code, "message": bad.Message}
					if brk != nil {
						v["index"], v["seq"], v["reason"] = brk.Index, brk.Seq, brk.Reason
					}
					res["bad_receipt"] = v
				}
				if err := writeJSON(out, res); err != nil {
					return err
				}
			}
			if bad != nil {
				return bad
			}
			if !jsonOutput {
				fmt.Fprintf(out, "receipt chain intact: %d receipts, head %s\n", len(rs), head)
				if sigsChecked {
					fmt.Fprintf(out, "every receipt is signed by the peers it credits (keys from %s)\n", fedPath)
				} else {
					fmt.Fprintln(out, "peer signatures not checked: no federation file (give --federation)")
				}
				if after > 0 {
					fmt.Fprintf(out, "it holds the given head; %d receipts follow it\n", after)
				}
				for _, name := range walked {
					fmt.Fprintf(out, "child cluster %s: chain intact, holds every cited head and the results the parent recorded\n", name)
				}
			}
			return nil
		},
	}
	s.register(cmd)
	cmd.Flags().StringVar(&wantHead, "head", "", "a chain head recorded earlier: the chain must hold it (detects receipts removed from the end)")
	cmd.Flags().StringArrayVar(&children, "child", nil, "NAME=FEDERATION or NAME=EXPORT.json: where the chain of a child cluster the receipts cite is (repeat per child)")
	return cmd
}

// checkSignatures checks every receipt's peer signatures against the
// federation file's keys (receipt.VerifySignatures). It returns the file
// used ("" when there is none to use: none given and none at the default
// places) and the first bad receipt's diagnostic.
func (s *receiptSource) checkSignatures(rs []receipt.Receipt) (string, *diag.Diagnostic, error) {
	path := firstNonEmpty(s.federation, os.Getenv("SCELLIS_FEDERATION"))
	if path == "" {
		path = filepath.Join(scellisHome(), "federation.yaml")
		if _, err := os.Stat(path); err != nil {
			return "", nil, nil
		}
	}
	fed, err := identity.LoadFederation(path)
	if err != nil {
		return "", nil, err
	}
	keyOf := func(peer string) (string, bool) {
		m, ok := fed.Member(peer)
		return m.PublicKey.String(), ok
	}
	for i := range rs {
		if err := rs[i].VerifySignatures(keyOf); err != nil {
			d, _ := diag.As(err)
			return path, d[0], nil
		}
	}
	return path, nil, nil
}

// receiptKeys are the JSON keys of an exported receipt, exactly, and
// receiptRequired those every receipt has (the export omits only empty
// omitempty fields).
var receiptKeys, receiptRequired = func() (map[string]bool, []string) {
	keys := map[string]bool{}
	var required []string
	t := reflect.TypeOf(receipt.Receipt{})
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		keys[name] = true
		if opts != "omitempty" {
			required = append(required, name)
		}
	}
	return keys, required
}()

// readReceiptExport reads a 'receipts export --format json' file,
// streaming: the file is never held whole, and the receipts decoded so far
// are checked against the process's memory limit as they grow (SC1206).
func readReceiptExport(path string) ([]receipt.Receipt, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, safefile.MaxLedger)
	if err != nil {
		return nil, diag.New(diag.FileUnreadable, path, "cannot read the receipt file: %v", configPathErr(err)).
			WithHelp("give the file 'scellis receipts export --format json' wrote")
	}
	defer f.Close()
	return decodeReceiptExport(path, bufio.NewReader(f))
}

// The memory limit is checked every receiptCheckBytes of the file, or
// receiptCheckEvery receipts, whichever comes first, for room for
// receiptRoom more: decoded, a receipt takes a few times its JSON (a peer
// name of two letters, five bytes in the file, is a string header and an
// allocation).
const (
	receiptCheckEvery = 1024
	receiptCheckBytes = 1 << 20
	receiptRoom       = 16 << 20
)

// decodeReceiptExport decodes a 'receipts export --format json' file
// strictly. encoding/json would match keys in any case, keep the last of a
// repeated key and ignore unknown or missing ones — each a way to make a
// file say something other than what its hashes cover (or, for a list of
// empty objects, to turn a few bytes of file into a whole receipt in
// memory) — so the keys of every receipt are checked token by token first.
func decodeReceiptExport(file string, r io.Reader) ([]receipt.Receipt, error) {
	bad := func(format string, args ...any) error {
		return diag.New(diag.ReceiptMalformed, file, format, args...).
			WithHelp("give the file 'scellis receipts export --format json' wrote, unedited")
	}
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, bad("not a receipt export: want a JSON list of receipts")
	}
	var rs []receipt.Receipt
	checked := int64(0)
	for i := 0; dec.More(); i++ {
		if at := dec.InputOffset(); i%receiptCheckEvery == 0 || at-checked >= receiptCheckBytes {
			if !memlimit.Fits(receiptRoom) {
				return nil, memlimit.TooLarge(file, fmt.Sprintf("%d receipts read so far", i),
					"verify the chain from the pool instead (scellis receipts verify, no --file), or export a shorter range")
			}
			checked = at
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, bad("receipt %d: %v", i, err)
		}
		keys := json.NewDecoder(bytes.NewReader(raw))
		if tok, err := keys.Token(); err != nil || tok != json.Delim('{') {
			return nil, bad("receipt %d is not a JSON object", i)
		}
		seen := map[string]bool{}
		for keys.More() {
			tok, err := keys.Token()
			if err != nil {
				return nil, bad("receipt %d: %v", i, err)
			}
			k, _ := tok.(string)
			switch {
			case !receiptKeys[k]:
				return nil, bad("receipt %d: unknown key %q (keys are case-sensitive)", i, k)
			case seen[k]:
				return nil, bad("receipt %d: key %q given twice", i, k)
			}
			seen[k] = true
			var skip json.RawMessage
			if err := keys.Decode(&skip); err != nil {
				return nil, bad("receipt %d: %v", i, err)
			}
		}
		for _, k := range receiptRequired {
			if !seen[k] {
				return nil, bad("receipt %d has no key %q", i, k)
			}
		}
		var r receipt.Receipt
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, bad("receipt %d: %v", i, err)
		}
		rs = append(rs, r)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
		return nil, bad("not a receipt export: the list does not end")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("not a receipt export: data after the list")
	}
	return rs, nil
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
