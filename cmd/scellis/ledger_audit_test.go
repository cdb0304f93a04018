package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
)

// `ledger audit` offline: a receipt export and a folder of contribution
// blobs (names do not matter, contents are hashed). The intact ledger
// passes; rolled back to a copy taken before its last charge, it fails with
// SC5042 and exit 2. Bad input is refused with a code.
func TestLedgerAuditOffline(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "privacy.ledger")
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	l, err := dp.Create(path, id.PrivateKey(), &dp.Options{Silo: "st-mary"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.DeclareBudget("icu", 40, 1e-5); err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(dir, "blobs")
	os.Mkdir(blobs, 0o700)
	run := content.Hash([]byte("a run"))
	var chain receipt.Chain
	var copyBeforeLast []byte
	for r := range 2 {
		if r == 1 {
			copyBeforeLast, _ = os.ReadFile(path)
		}
		ms := []dp.Mechanism{dp.SubsampledGaussian(3, 1, 1)}
		e, err := l.Charge(dp.ChargeRequest{Dataset: "icu", Consumer: silo.Consumer(string(run), r), Mechanisms: ms})
		if err != nil {
			t.Fatal(err)
		}
		sc, _ := silo.Sign(id, silo.Contribution{Format: silo.ContributionFormat, Run: run, Round: r, Job: run, Silo: "st-mary",
			Dataset: "icu", Status: silo.Contributed, LedgerEntry: e.Hash, Mechanisms: ms, Epsilon: e.Charge.Epsilon,
			LedgerSeq: e.Seq, LedgerHead: e.Hash})
		b, _ := content.Encode(sc)
		os.WriteFile(filepath.Join(blobs, fmt.Sprint("record-", r)), b, 0o600)
		rc := chain.Next(receipt.Receipt{Job: run, Shard: content.Hash([]byte{byte(r)}), ShardIndex: r, Result: content.Hash(b),
			Peers: []string{"st-mary"}, Method: "quorum-1-exact", WorkUnits: 1, PriceBasis: "round"})
		if err := chain.Append(rc); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	rb, _ := json.Marshal(chain.All())
	receipts := filepath.Join(dir, "receipts.json")
	os.WriteFile(receipts, rb, 0o600)

	code, out, errs := scellisInProcess(t, "ledger", "audit", path, "--receipts", receipts, "--contributions", blobs)
	if code != 0 || !strings.Contains(out, "the ledger agrees with the receipt chain") {
		t.Fatalf("intact ledger: exit %d\n%s%s", code, out, errs)
	}
	os.WriteFile(path, copyBeforeLast, 0o600)
	if code, _, errs := scellisInProcess(t, "ledger", "verify", "--ledger", path); code != 0 {
		t.Fatalf("the older copy should verify in itself: exit %d %s", code, errs)
	}
	code, out, errs = scellisInProcess(t, "--json", "ledger", "audit", path, "--receipts", receipts, "--contributions", blobs)
	if code != 2 || !strings.Contains(errs, "SC5042") || !strings.Contains(out, `"problem"`) {
		t.Fatalf("rolled-back ledger: exit %d\n%s%s", code, out, errs)
	}

	for _, bad := range []struct {
		args []string
		code string
	}{
		{[]string{"ledger", "audit", filepath.Join(dir, "none.ledger"), "--receipts", receipts, "--contributions", blobs}, "SC5018"},
		{[]string{"ledger", "audit", receipts, "--receipts", receipts, "--contributions", blobs}, "SC5013"},
		{[]string{"ledger", "audit", path, "--receipts", path, "--contributions", blobs}, "SC7014"},
		{[]string{"privacy", "report", "abcdef012345", "--format", "xml"}, "SC1005"},
	} {
		code, _, errs := scellisInProcess(t, bad.args...)
		if code != 2 || !strings.Contains(errs, bad.code) {
			t.Errorf("scellis %v: exit %d, want 2 with %s:\n%s", bad.args, code, bad.code, errs)
		}
	}
}
