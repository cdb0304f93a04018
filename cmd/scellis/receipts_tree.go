package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// A tree of coordinator clusters (docs/tree.md): a parent's receipt of a
// shard a child cluster computed cites the child chain's head. `receipts
// verify` walks the tree: for each cited child it loads the child's chain
// (from the child cluster, through --child NAME=FEDERATION, or from an
// export, --child NAME=FILE.json), verifies it up to the cited heads, and
// checks that the child verified what the parent recorded: a receipt of
// the same shard with the same result, at or before the cited head.

// childSources parses the --child flags: NAME=PATH each.
func childSources(flags []string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range flags {
		name, path, ok := strings.Cut(f, "=")
		if !ok || name == "" || path == "" {
			return nil, diag.New(diag.FlagValue, "--child", "%q is not NAME=FILE", f).
				WithHelp("name the child cluster as the parent federation does, and give its federation file (its chain is fetched from it) or a receipt export (.json)")
		}
		if prev, dup := out[name]; dup {
			// Which one would be walked is not for the flag order to decide.
			return nil, diag.New(diag.FlagValue, "--child", "child %s is given twice (%s and %s)", name, prev, path).
				WithHelp("give each child cluster once")
		}
		out[name] = path
	}
	return out, nil
}

// treeWalk checks every citation of the parent chain rs, and then, down
// the tree, every citation of each child's chain of its own children (a
// tree of three levels or more). loadChild returns a child's chain. It
// returns the clusters walked (each level's in name order, the parent's
// children first) and the first problem.
func treeWalk(rs []receipt.Receipt, sources map[string]string, loadChild func(name, path string) ([]receipt.Receipt, error)) ([]string, *diag.Diagnostic, error) {
	return walkLevel(rs, sources, loadChild, map[string]bool{})
}

// walkLevel is treeWalk for one chain; seen holds the clusters already
// walked (a chain citing one of them again — its parent, or a cycle — is
// walked once).
func walkLevel(rs []receipt.Receipt, sources map[string]string, loadChild func(name, path string) ([]receipt.Receipt, error), seen map[string]bool) ([]string, *diag.Diagnostic, error) {
	type cited struct {
		parent receipt.Receipt
		cite   receipt.Citation
	}
	byChild := map[string][]cited{}
	for _, r := range rs {
		if err := r.VerifyCites(); err != nil {
			d, _ := diag.As(err)
			return nil, d[0], nil
		}
		for _, c := range r.Cites {
			byChild[c.Peer] = append(byChild[c.Peer], cited{r, c})
		}
	}
	var names []string
	for n := range byChild {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var below []string // the walked children's own children
	for _, name := range names {
		path, ok := sources[name]
		if !ok {
			return names, diag.New(diag.TreeChildChain, name, "%d receipts cite the chain of child cluster %s, which was not given", len(byChild[name]), name).
				WithHelp("give --child %s=FEDERATION (the child's federation file; its chain is fetched from its aggregators) or --child %s=EXPORT.json", name, name), nil
		}
		chain, err := loadChild(name, path)
		if err != nil {
			msg := err.Error()
			if ds, ok := diag.As(err); ok { // not a diagnostic rendered inside another
				msg = ds[0].Message
				if p := ds[0].Pos; p != nil && p.File != "" && p.Line > 0 {
					msg = fmt.Sprintf("%s:%d: %s", p.File, p.Line, msg)
				}
				if len(ds) > 1 {
					msg += fmt.Sprintf(" (and %d more problems)", len(ds)-1)
				}
			}
			help := "check that the child cluster runs and that this identity is a member of its federation, or give an export of its chain"
			if isExport(path) {
				help = fmt.Sprintf("give the file 'scellis receipts export --format json' wrote on a node of %s, or its federation file to fetch the chain", name)
			}
			return names, diag.New(diag.TreeChildChain, name, "the chain of child cluster %s cannot be read from %s: %s", name, path, msg).WithHelp("%s", help), nil
		}
		if err := receipt.Verify(chain); err != nil {
			d, _ := diag.As(err)
			msg := err.Error()
			if len(d) > 0 {
				msg = d[0].Message
			}
			return names, diag.New(diag.TreeChildChain, name, "the chain of child cluster %s fails verification: %s", name, msg).
				WithHelp("the child's chain was altered; compare with another node of the child cluster"), nil
		}
		// The child's receipts of each shard ID and result.
		type key struct {
			shard, result content.Ref
		}
		first := map[key]uint64{}
		for _, r := range chain {
			k := key{r.Shard, r.Result}
			if _, ok := first[k]; !ok && r.Reverses == 0 {
				first[k] = r.Seq
			}
		}
		for _, c := range byChild[name] {
			switch {
			case c.cite.Seq > uint64(len(chain)):
				return names, diag.New(diag.TreeChildChain, fmt.Sprintf("receipt %d", c.parent.Seq), "it cites receipt %d of child %s, whose chain has %d receipts: receipts were removed from the child's chain", c.cite.Seq, name, len(chain)).
					WithHelp("the child's chain must hold every head its parent cites; compare with another node of the child cluster"), nil
			case chain[c.cite.Seq-1].Hash != c.cite.Head:
				return names, diag.New(diag.TreeChildChain, fmt.Sprintf("receipt %d", c.parent.Seq), "it cites child %s's head %d as %s, but that receipt is %s in the child's chain", name, c.cite.Seq, c.cite.Head.Short(), chain[c.cite.Seq-1].Hash.Short()).
					WithHelp("the child's chain is not the one the parent recorded; it was rewritten, or it is another cluster's"), nil
			}
			seq, ok := first[key{c.parent.Shard, c.parent.Result}]
			if !ok || seq > c.cite.Seq {
				return names, diag.New(diag.TreeChildChain, fmt.Sprintf("receipt %d", c.parent.Seq), "the parent recorded result %s for shard %s from child %s, but the child's chain up to its cited head %d holds no such verified receipt", c.parent.Result.Short(), c.parent.Shard.Short(), name, c.cite.Seq).
					WithHelp("the child reported a result its own cluster never verified"), nil
			}
		}
		// The child may be a parent too: its receipts cite its children.
		sub, bad, err := walkLevel(chain, sources, loadChild, seen)
		below = append(below, sub...)
		if bad != nil || err != nil {
			return append(names, below...), bad, err
		}
	}
	return append(names, below...), nil, nil
}

// loadChildChain reads a child's chain: an export file (.json), or from
// the child cluster's aggregators named in its federation file, as this
// member (whose key the child's federation must list).
func (s *receiptSource) loadChildChain(ctx context.Context, name, path string) ([]receipt.Receipt, error) {
	if isExport(path) {
		return readReceiptExport(path)
	}
	// The child's file first: a path that is wrong is the first thing to
	// say, before this member's own identity.
	fed, err := identity.LoadFederation(path)
	if err != nil {
		return nil, err
	}
	id, _, err := s.loadMember(io.Discard)
	if err != nil {
		return nil, err
	}
	c, err := api.NewClient(id, fed)
	if err != nil {
		return nil, err
	}
	c.GiveUpAfter = giveUpAfter
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return c.Receipts(cctx, 0)
}

// isExport reports whether a --child path is a receipt export (.json)
// rather than a federation file.
func isExport(path string) bool { return strings.EqualFold(filepath.Ext(path), ".json") }

// citedChildren names the children rs cites, sorted.
func citedChildren(rs []receipt.Receipt) []string {
	var out []string
	for _, r := range rs {
		for _, c := range r.Cites {
			out = append(out, c.Peer)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
