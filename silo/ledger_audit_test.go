package silo_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
)

// auditFixture is a silo's ledger with three round charges, the silo's
// signed contribution records, and a receipt chain citing them (with a
// generic shard's receipt in between).
type auditFixture struct {
	path     string
	id       *identity.Identity
	receipts []receipt.Receipt
	blobs    map[content.Ref][]byte
	// sizeBefore is the ledger file's size before the entry of each
	// sequence number was appended: where to cut to lose that entry.
	sizeBefore map[uint64]int64
}

func newAuditFixture(t *testing.T) *auditFixture {
	t.Helper()
	f := &auditFixture{path: filepath.Join(t.TempDir(), "privacy.ledger"), blobs: map[content.Ref][]byte{}, sizeBefore: map[uint64]int64{}}
	var err error
	if f.id, err = identity.Generate(); err != nil {
		t.Fatal(err)
	}
	l, err := dp.Create(f.path, f.id.PrivateKey(), &dp.Options{Silo: "st-mary"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.DeclareBudget("icu", 50, 1e-5); err != nil {
		t.Fatal(err)
	}
	run := content.Hash([]byte("run"))
	var chain receipt.Chain
	put := func(b []byte, peer string, shard int) {
		ref := content.Hash(b)
		f.blobs[ref] = b
		r := chain.Next(receipt.Receipt{Job: content.Hash([]byte(fmt.Sprint("job", shard))), Shard: content.Hash([]byte(fmt.Sprint("shard", shard))),
			ShardIndex: shard, Result: ref, Peers: []string{peer}, Method: "quorum-1-exact", WorkUnits: 1, PriceBasis: "test"})
		if err := chain.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		ms := []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}
		fi, err := os.Stat(f.path)
		if err != nil {
			t.Fatal(err)
		}
		e, err := l.Charge(dp.ChargeRequest{Dataset: "icu", Consumer: silo.Consumer(string(run), round), Mechanisms: ms})
		if err != nil {
			t.Fatal(err)
		}
		f.sizeBefore[e.Seq] = fi.Size()
		rec := silo.Contribution{Format: silo.ContributionFormat, Run: run, Round: round, Job: content.Hash([]byte("job")), Silo: "st-mary",
			Dataset: "icu", Status: silo.Contributed, LedgerEntry: e.Hash, Mechanisms: ms, Epsilon: e.Charge.Epsilon,
			LedgerSeq: e.Seq, LedgerHead: e.Hash}
		sc, err := silo.Sign(f.id, rec)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := content.Encode(sc)
		put(b, "st-mary", round)
		put([]byte(fmt.Sprint("a generic result ", round)), "st-mary", 10+round)
	}
	f.receipts = chain.All()
	return f
}

func (f *auditFixture) audit(t *testing.T) *silo.Audit {
	t.Helper()
	snap, err := dp.Verify(f.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := silo.AuditLedger(snap, "st-mary", f.receipts, func(r content.Ref) ([]byte, error) {
		if b, ok := f.blobs[r]; ok {
			return b, nil
		}
		return nil, os.ErrNotExist
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The ledger agrees with the chain; cut off its last charge, or put a
// ledger under another key in its place, and the audit names the entries
// the chain anchors that the ledger lacks.
func TestAuditLedgerAgainstReceipts(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	a := f.audit(t)
	if len(a.Problems()) != 0 || a.Contributions != 3 || len(a.Anchors) != 6 || a.Highest != 4 {
		t.Fatalf("intact ledger: %+v", a)
	}
	good, _ := os.ReadFile(f.path)

	// Truncated: the last charge (entry 4) is gone.
	snap, _ := dp.Verify(f.path, nil)
	last := snap.Entries()[4]
	data := good[:f.sizeBefore[last.Seq]]
	os.WriteFile(f.path, data, 0o600)
	if s, err := dp.Verify(f.path, nil); err != nil || s.Len() != 4 {
		t.Fatalf("the truncated ledger should verify in itself: %v", err)
	}
	a = f.audit(t)
	if p := a.Problems(); len(p) != 2 || p[0].Receipt != 5 || p[1].Seq != 4 {
		t.Fatalf("truncated ledger: problems %+v", p)
	}

	// Replaced by a fresh ledger under another key.
	os.Remove(f.path)
	other, _ := identity.Generate()
	l, err := dp.Create(f.path, other.PrivateKey(), &dp.Options{Silo: "st-mary"})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if p := f.audit(t).Problems(); len(p) != 3 || p[0].Kind != "key" {
		t.Fatalf("replaced ledger: problems %+v", p)
	}
}
