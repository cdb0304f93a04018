package main

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/silo"
)

// A charge is counted once however many records name it, with the receipt
// as its proof when one exists; a charge only an abandoned attempt's
// record names is listed with that job instead of a receipt.
func TestPrivacyRowsAbandonedAttempts(t *testing.T) {
	m := []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}
	rec := func(round int, status string, entry content.Ref) silo.Contribution {
		return silo.Contribution{Silo: "h1", Dataset: "patients", Round: round, Status: status, LedgerEntry: entry, Mechanisms: m, Epsilon: 0.5, Delta: 1e-5}
	}
	e0, e1 := content.Hash([]byte("entry 0")), content.Hash([]byte("entry 1"))
	job := content.Hash([]byte("abandoned job"))
	rows, err := privacyRows([]citedRecord{
		{rec: rec(0, silo.Failed, e0), abandoned: job, result: content.Hash([]byte("r0"))}, // paid, then abandoned
		{r: receipt.Receipt{Seq: 7}, rec: rec(0, silo.Contributed, e0)},                    // the retry re-sent it
		{rec: rec(1, silo.Failed, e1), abandoned: job, result: content.Hash([]byte("r1"))}, // paid, never retried
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Rounds != 2 || len(rows[0].Charges) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	c0, c1 := rows[0].Charges[0], rows[0].Charges[1]
	if c0.Receipt != 7 || c0.AbandonedJob != "" || c0.LedgerEntry != e0 {
		t.Errorf("round 0: %+v, want the receipt as proof", c0)
	}
	if c1.Receipt != 0 || c1.AbandonedJob != job || c1.LedgerEntry != e1 || receiptList(rows[0].Charges, ",") != "7,abandoned:"+job.Short() {
		t.Errorf("round 1: %+v (%s), want the abandoned job as proof", c1, receiptList(rows[0].Charges, ","))
	}
}

// A record a silo delivered from its outbox after the round was reduced
// without it has no receipt: its charge is listed with the job as late.
func TestPrivacyRowsLateRecord(t *testing.T) {
	m := []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}
	e := content.Hash([]byte("entry"))
	job := content.Hash([]byte("reduced job"))
	rows, err := privacyRows([]citedRecord{
		{rec: silo.Contribution{Silo: "h1", Dataset: "patients", Round: 3, Status: silo.Failed, LedgerEntry: e, Mechanisms: m, Epsilon: 0.5, Delta: 1e-5},
			abandoned: job, result: content.Hash([]byte("r")), late: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Rounds != 1 || rows[0].RunEps <= 0 {
		t.Fatalf("rows %+v", rows)
	}
	c := rows[0].Charges[0]
	if c.LateJob != job || c.AbandonedJob != "" || c.Status != "failed (late record)" || receiptList(rows[0].Charges, ",") != "late:"+job.Short() {
		t.Errorf("charge %+v (%s), want the reduced job as proof of a late record", c, receiptList(rows[0].Charges, ","))
	}
}
