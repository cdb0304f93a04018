package silo

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
)

// An outbox entry round-trips durably under its shard's name; a job ID
// that is not a ref names no file (law 14); an entry left by a silo that
// died before paying (no charge for its consumer in the ledger) is
// dropped at start without anything being delivered.
func TestOutboxEntries(t *testing.T) {
	dir := t.TempDir()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	l, err := dp.Create(filepath.Join(dir, "privacy.ledger"), id.PrivateKey(), &dp.Options{Silo: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := &Appliance{Name: "h1", ID: id, Config: &config.Silo{DataDir: dir}, Ledger: l}
	job := content.Hash([]byte("job"))
	rec := Contribution{Format: ContributionFormat, Run: content.Hash([]byte("run")), Round: 2, Job: job, Shard: 1, Silo: "h1"}
	if _, err := a.outboxPath("not-a-ref", 0); err == nil {
		t.Error("a job ID that is not a ref named an outbox file")
	}
	if err := a.outboxPut(outboxEntry{Consumer: Consumer(string(rec.Run), 2), Record: rec}); err != nil {
		t.Fatal(err)
	}
	e, err := a.outboxGet(job, 1)
	if err != nil || e.Record.Job != job || e.Record.Shard != 1 || e.Record.Round != 2 || e.Consumer != Consumer(string(rec.Run), 2) || e.Signed != nil {
		t.Fatalf("entry %+v, %v", e, err)
	}
	left, err := a.deliverOutbox(context.Background())
	if left != 0 || err != nil {
		t.Fatalf("delivering an unpaid entry: %d left, %v", left, err)
	}
	if files, _ := os.ReadDir(filepath.Join(dir, outboxDir)); len(files) != 0 {
		t.Errorf("the unpaid entry is still in the outbox: %v", files)
	}
}
