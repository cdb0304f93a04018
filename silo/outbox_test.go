package silo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
)

// An outbox entry round-trips durably under its shard's name; a job ID
// that is not a ref names no file (law 14); an entry left by a silo that
// died before paying (no charge for its consumer in the ledger) is
// dropped at start without anything being delivered, and so is an
// interrupted write's temporary file.
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
	// A write interrupted by a crash leaves writeDurable's temporary
	// file; a starting silo removes it, so its outbox drains.
	if err := os.WriteFile(filepath.Join(dir, outboxDir, ".tmp-590223349"), []byte("half an entry"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.flushOutbox(context.Background())
	if files, _ := os.ReadDir(filepath.Join(dir, outboxDir)); len(files) != 0 {
		t.Errorf("a starting silo left an interrupted write in its outbox: %v", files)
	}
}

// A round's signed record is durable in the outbox before its hash is
// reported: it is written while the record's bytes upload (issue 19), and
// the pool's report endpoint finds it there, byte for byte. The job's
// policy, known from the lease (KnowPolicy), is not asked for again, and
// the entry is gone once the pool took the report.
func TestReportAfterOutbox(t *testing.T) {
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
	rec := Contribution{Format: ContributionFormat, Run: content.Hash([]byte("run")), Round: 2, Job: job, Shard: 1, Silo: "h1", Status: Contributed}
	// Written before the charge, as round does: the record unsigned.
	if err := a.outboxPut(outboxEntry{Consumer: Consumer(string(rec.Run), 2), Record: rec}); err != nil {
		t.Fatal(err)
	}
	var uploaded []byte
	var reports int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/blobs/"):
			uploaded, _ = io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/results":
			reports++
			var req api.ResultReport
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				t.Errorf("report: %v", err)
			}
			e, err := a.outboxGet(job, 1)
			switch {
			case err != nil:
				t.Errorf("the outbox entry at the report: %v", err)
			case e.Signed == nil || content.Hash(e.Signed) != req.Result || !bytes.Equal(e.Signed, uploaded):
				t.Errorf("the report names %s; the outbox entry holds %d signed bytes (hash %s), the upload %d", req.Result.Short(), len(e.Signed), content.Hash(e.Signed).Short(), len(uploaded))
			}
			json.NewEncoder(w).Encode(coordinator.ReportResponse{Job: req.Job, Shard: req.Shard, Peer: "h1", Result: req.Result, Outcome: coordinator.OutcomeVerified})
		default:
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			http.Error(w, "unexpected", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	a.Client = api.NewClientTLS(srv.Client().Transport, []string{srv.URL})
	a.Worker().KnowPolicy(job, coordinator.Policy{Replicas: 1})
	if err := a.report(coordinator.LeaseGrant{Job: job, Shard: 1}, rec); err != nil {
		t.Fatal(err)
	}
	if reports != 1 {
		t.Fatalf("%d reports", reports)
	}
	if _, err := a.outboxGet(job, 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the delivered entry is still in the outbox: %v", err)
	}
}
