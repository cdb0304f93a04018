package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl/account"
)

// checkPrivacyReportAndAudit runs against the federation of
// TestFLRunWithSilos once its run id is done (h1, h2, h5 took part in three
// rounds, h3 in two before its budget ran out, h4 declined every round):
// `privacy report` shows each silo's charges with the receipts proving
// them, in a table, JSON and CSV; `ledger audit` passes on h1's ledger,
// and fails (SC5042, exit 2) once the ledger's last entry is cut off — a
// truncation the ledger cannot show by itself.
func checkPrivacyReportAndAudit(t *testing.T, c *cluster, id string) {
	t.Helper()
	var rep struct {
		Silos []account.Dataset `json:"silos"`
	}
	out := c.mustCLI("alice", "--json", "privacy", "report", id)
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("privacy report --json: %v\n%s", err, out)
	}
	want := map[string][2]int{"h1": {3, 0}, "h2": {3, 0}, "h3": {2, 1}, "h4": {0, 3}, "h5": {3, 0}}
	if len(rep.Silos) != len(want) {
		t.Fatalf("privacy report has %d rows, want %d:\n%s", len(rep.Silos), len(want), out)
	}
	for _, r := range rep.Silos {
		w := want[r.Silo]
		if r.Dataset != "patients" || r.Rounds != w[0] || r.Declined != w[1] || len(r.Charges) != w[0] {
			t.Fatalf("%s: %d rounds, %d declined, want %v:\n%s", r.Silo, r.Rounds, r.Declined, w, out)
		}
		if r.Rounds == 0 {
			continue
		}
		for _, ch := range r.Charges {
			if ch.Receipt == 0 || ch.LedgerEntry == "" || ch.Epsilon <= 0 {
				t.Fatalf("%s: a charge without its proof: %+v", r.Silo, ch)
			}
		}
		// Composed in RDP, the run costs less than the sum of its rounds
		// and more than any one; the ledger's figure covers the run.
		sum := 0.0
		for _, e := range r.PerRound {
			sum += e
		}
		if !(r.RunEps > r.PerRound[0] && r.RunEps <= sum+1e-9 && r.LedgerEps >= r.RunEps-1e-6 && r.Remaining == r.Budget-r.LedgerEps) || r.Delta != 1e-5 || len(r.Sigma) != 1 || len(r.Q) != 1 {
			t.Fatalf("%s: run ε %v, rounds %v, ledger ε %v, budget %v, remaining %v, δ %v", r.Silo, r.RunEps, r.PerRound, r.LedgerEps, r.Budget, r.Remaining, r.Delta)
		}
	}
	csv := c.mustCLI("alice", "privacy", "report", id[7:19], "--format", "csv")
	if lines := strings.Split(strings.TrimSpace(csv), "\n"); len(lines) != 6 || !strings.HasPrefix(lines[0], "silo,dataset,mechanism,sigma,q,rounds_contributed") {
		t.Fatalf("privacy report CSV:\n%s", csv)
	}
	table := c.mustCLI("alice", "privacy", "report", id)
	if !strings.Contains(table, "RECEIPTS") || !strings.Contains(table, "h4") {
		t.Fatalf("privacy report table:\n%s", table)
	}

	ledger := filepath.Join("h1", "data", "privacy.ledger")
	if out := c.mustCLI("alice", "ledger", "audit", ledger); !strings.Contains(out, "the ledger agrees with the receipt chain") {
		t.Fatalf("ledger audit of an intact ledger:\n%s", out)
	}
	// Stop h1 and cut its ledger's last entry: the ledger verifies in
	// itself, the chain says otherwise.
	c.kill("h1", syscall.SIGTERM)
	c.waitExit("h1")
	path := filepath.Join(c.dir, ledger)
	s, err := dp.Verify(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, entryOffset(t, path, s.Len()-1)); err != nil {
		t.Fatal(err)
	}
	c.mustCLI("alice", "ledger", "verify", "--ledger", ledger)
	out, errs, err := c.cli("alice", "ledger", "audit", ledger)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(errs, "SC5042") || !strings.Contains(out, "MISMATCH") {
		t.Fatalf("ledger audit of a truncated ledger: %v\n%s%s", err, out, errs)
	}
	t.Logf("ledger audit of the truncated ledger:\n%s%s", out, errs)
}
