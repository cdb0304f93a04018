package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// The tree walk of `receipts verify` (in process, on chains it builds):
// it passes when the child's chain holds the cited head and a receipt of
// the same shard and result before it, and fails with SC7603 when the
// child is not given, its chain is shorter than the cited head, the head
// is another receipt, or the child never verified what it reported.
func TestTreeWalk(t *testing.T) {
	child, parentOf, res := treeChains(t)
	seq, head := child.Head()
	load := func(string, string) ([]receipt.Receipt, error) { return child.All(), nil }
	given := map[string]string{"eu": "eu.json"}
	walk := func(rs []receipt.Receipt, sources map[string]string) *diag.Diagnostic {
		t.Helper()
		_, d, err := treeWalk(rs, sources, load)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := walk(parentOf(seq, head, res), given); d != nil {
		t.Fatalf("a faithful child fails the walk: %v", d)
	}
	for what, c := range map[string]struct {
		rs      []receipt.Receipt
		sources map[string]string
		want    string
	}{
		"child not given":      {parentOf(seq, head, res), nil, "was not given"},
		"head past the chain":  {parentOf(seq+1, head, res), given, "receipts were removed"},
		"another head":         {parentOf(1, head, res), given, "is not the one the parent recorded"},
		"result never checked": {parentOf(seq, head, content.Hash([]byte("forged"))), given, "holds no such verified receipt"},
	} {
		d := walk(c.rs, c.sources)
		if d == nil || d.Code != diag.TreeChildChain || !strings.Contains(d.Message+d.Help, c.want) {
			t.Errorf("%s: got %v, want SC7603 saying %q", what, d, c.want)
		}
	}
	_, d, err := treeWalk(parentOf(seq, head, res), given, func(string, string) ([]receipt.Receipt, error) { return nil, errors.New("down") })
	if err != nil || d == nil || d.Code != diag.TreeChildChain || !strings.Contains(d.Message, "cannot be read") {
		t.Errorf("an unreachable child: %v, %v; want SC7603", d, err)
	}
}

// treeChains builds a child chain of two receipts (shard 8, then shard 7
// with result res) and returns it with parentOf, which makes a parent
// chain of one receipt of shard 7 from child eu citing (seq, head) with
// result, signed by eu's key.
func treeChains(t *testing.T) (child *receipt.Chain, parentOf func(seq uint64, head, result content.Ref) []receipt.Receipt, res content.Ref) {
	t.Helper()
	eu := identity.NewFromSeed([32]byte{3})
	shard := content.Hash([]byte("shard 7"))
	res = content.Hash([]byte("result"))
	child, _ = receipt.NewChain(nil)
	mint := func(c *receipt.Chain, r receipt.Receipt) receipt.Receipt {
		r = c.Next(r)
		if err := c.Append(r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := receipt.Receipt{Job: content.Hash([]byte("sub")), Peers: []string{"w1"}, Method: "quorum-1-exact", PriceBasis: "flat"}
	other := base
	other.Shard, other.Result = content.Hash([]byte("shard 8")), res
	mint(child, other)
	ok := base
	ok.Shard, ok.Result, ok.ShardIndex = shard, res, 1
	mint(child, ok)
	return child, func(seq uint64, head, result content.Ref) []receipt.Receipt {
		st := receipt.Statement{Job: content.Hash([]byte("parent")), Shard: 7, Result: result, Tier: receipt.TierReplayable, Peer: "eu"}
		c := receipt.Citation{Peer: "eu", Seq: seq, Head: head}
		c.Sig = identity.Sign(eu, identity.PurposeCite, receipt.CitationBytes(c.Peer, c.Seq, c.Head))
		pc, _ := receipt.NewChain(nil)
		return []receipt.Receipt{mint(pc, receipt.Receipt{Job: st.Job, Shard: shard, ShardIndex: 7, Result: result, Peers: []string{"eu"}, Method: "quorum-1-exact", PriceBasis: "flat",
			Tier: receipt.TierReplayable, Signatures: []receipt.PeerSignature{{Peer: "eu", Result: result, Key: eu.Public().String(), Sig: identity.Sign(eu, identity.PurposeResult, st.Bytes())}},
			Cites: []receipt.Citation{c}})}
	}, res
}

// receipts verify --child through the binary, on exports: the child's
// export passes; a child given twice, an export that is no export, a
// missing child federation file and another chain are refused (exit 2)
// with what was wrong with which file.
func TestReceiptsVerifyChildCLI(t *testing.T) {
	t.Parallel() // files only
	dir := t.TempDir()
	child, parentOf, res := treeChains(t)
	seq, head := child.Head()
	other, _ := receipt.NewChain(nil)
	for _, x := range []string{"x", "y"} { // as long as child's chain, not it
		o := receipt.Receipt{Job: content.Hash([]byte("sub")), Peers: []string{"w1"}, Method: "quorum-1-exact", PriceBasis: "flat", Shard: content.Hash([]byte(x)), Result: res}
		if err := other.Append(other.Next(o)); err != nil {
			t.Fatal(err)
		}
	}
	for name, rs := range map[string][]receipt.Receipt{"parent.json": parentOf(seq, head, res), "child.json": child.All(), "other.json": other.All()} {
		b, _ := json.Marshal(rs)
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{}"), 0o644)
	out := mustRun(t, scellisCmd(t, dir, "receipts", "verify", "--file", "parent.json", "--child", "eu=child.json"))
	if !strings.Contains(out, "child cluster eu: chain intact") {
		t.Fatalf("a faithful child's export:\n%s", out)
	}
	for _, c := range []struct{ child, want string }{
		{"eu=child.json --child eu=other.json", "child eu is given twice"},
		{"eu=bad.json", "bad.json: not a receipt export"},
		{"eu=gone.yaml", "cannot read gone.yaml"},
		{"eu=other.json", "another cluster's"},
	} {
		args := append([]string{"receipts", "verify", "--file", "parent.json"}, strings.Fields("--child "+c.child)...)
		code, _, stderr := runBounded(t, scellisBinary(t), dir, args...)
		if code != 2 || !strings.Contains(stderr, c.want) || strings.Count(stderr, "error[") != 1 {
			t.Errorf("--child %s: exit %d, want 2 with one diagnostic saying %q:\n%s", c.child, code, c.want, stderr)
		}
	}
}
