package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/dp"
)

// These tests run real `scellis` processes: testscript.Main (TestMain in
// script_test.go) puts a copy of this test binary named scellis on $PATH,
// which runs the CLI when invoked under that name.

func scellisBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("scellis")
	if err != nil {
		t.Fatalf("scellis is not on PATH (TestMain should have installed it): %v", err)
	}
	return p
}

// scellisRun runs one scellis process to completion and returns its exit
// code and output.
func scellisRun(ctx context.Context, t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, scellisBin(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

func initLedger(ctx context.Context, t *testing.T, budget string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "privacy.ledger")
	if code, _, stderr := scellisRun(ctx, t, "ledger", "init", "--ledger", path, "--budget", "icu="+budget, "--delta", "1e-5"); code != 0 {
		t.Fatalf("ledger init: exit %d: %s", code, stderr)
	}
	return path
}

func parseChargeLines(t *testing.T, out string) []chargeLine {
	t.Helper()
	var lines []chargeLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var c chargeLine
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			t.Fatalf("charge output %q: %v", l, err)
		}
		lines = append(lines, c)
	}
	return lines
}

// Two processes race to charge one dataset until each is refused: the
// ledger never exceeds the budget, both made progress, and every charge a
// process reported is in the verified ledger exactly once.
func TestLedgerTwoProcessesRace(t *testing.T) {
	t.Parallel() // its own processes and directories
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	path := initLedger(ctx, t, "1")
	type result struct {
		code   int
		stdout string
		stderr string
	}
	results := make(chan result, 2)
	for _, who := range []string{"proc-a", "proc-b"} {
		go func() {
			code, out, errs := scellisRun(ctx, t, "--json", "ledger", "charge", "--ledger", path, "--dataset", "icu",
				"--consumer", who, "--sigma", "3", "--q", "0.01", "--steps", "20", "--repeat", "100000")
			results <- result{code, out, errs}
		}()
	}
	var all []chargeLine
	perProc := map[string]int{}
	for range 2 {
		r := <-results
		if r.code != 2 || !strings.Contains(r.stderr, "SC5010") {
			t.Fatalf("a racer ended with exit %d, not an overdraft refusal: %s", r.code, r.stderr)
		}
		for _, c := range parseChargeLines(t, r.stdout) {
			all = append(all, c)
			perProc[c.Consumer]++
			if c.Cumulative > 1 {
				t.Errorf("entry %d reports cumulative ε %v over the budget", c.Seq, c.Cumulative)
			}
		}
	}
	s, err := dp.Verify(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.Dataset("icu")
	t.Logf("%d charges (%v), spent ε=%.6g of 1", st.Charges, perProc, st.Spent)
	if st.Spent > 1 {
		t.Fatalf("spent ε=%v exceeds the budget", st.Spent)
	}
	if perProc["proc-a"] == 0 || perProc["proc-b"] == 0 {
		t.Fatalf("one process never charged (%v): no race took place", perProc)
	}
	if st.Charges != len(all) {
		t.Fatalf("ledger holds %d charges, processes reported %d", st.Charges, len(all))
	}
	seqs := map[uint64]bool{}
	for _, c := range all {
		if seqs[c.Seq] {
			t.Fatalf("entry %d reported twice", c.Seq)
		}
		seqs[c.Seq] = true
		if e, ok := s.Find(c.Hash); !ok || e.Seq != c.Seq || e.Charge.Consumer != c.Consumer {
			t.Fatalf("reported entry %d (%s) is not in the ledger", c.Seq, c.Hash.Short())
		}
	}
	// The budget is exhausted for this mechanism: one more step does not fit.
	if n, _ := dp.MaxSteps(s.Orders(), rdpOf(s, "icu"), 0.01, 3, 1, 1e-5, s.Conversion()); n >= 20 {
		t.Fatalf("%d more steps would still fit, yet both racers were refused", n)
	}
}

func rdpOf(s *dp.Snapshot, dataset string) []float64 {
	sum := make([]float64, len(s.Orders()))
	for _, e := range s.Entries() {
		if e.Charge != nil && e.Charge.Dataset == dataset {
			for i, v := range e.Charge.RDP {
				sum[i] += v
			}
		}
	}
	return sum
}

// kill -9 in the middle of a loop of charges, several times: the ledger
// always verifies, every charge the process reported (it reports only after
// fsync) is still there, and the next process charges normally.
func TestLedgerKill9DuringCharges(t *testing.T) {
	t.Parallel() // its own processes and directories
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	path := initLedger(ctx, t, "1e6")
	var reported []chargeLine
	for round, after := range []int{1, 7, 3, 15, 5} {
		cmd := exec.CommandContext(ctx, scellisBin(t), "--json", "ledger", "charge", "--ledger", path, "--dataset", "icu",
			"--consumer", "kill-"+string(rune('a'+round)), "--sigma", "5", "--q", "0.001", "--steps", "1", "--repeat", "1000000")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		n := 0
		for n < after && sc.Scan() {
			reported = append(reported, parseChargeLines(t, sc.Text())...)
			n++
		}
		if n < after {
			t.Fatalf("round %d: the charging process stopped after %d charges", round, n)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		// Lines already written before the kill are durable charges too.
		for sc.Scan() {
			reported = append(reported, parseChargeLines(t, sc.Text())...)
		}
		cmd.Wait()
		if ctx.Err() != nil {
			t.Fatal("deadline passed")
		}

		code, out, stderr := scellisRun(ctx, t, "ledger", "verify", "--ledger", path, "--pubkey", path+".pub")
		if code != 0 {
			t.Fatalf("round %d: verify after kill -9: exit %d\n%s%s", round, code, out, stderr)
		}
		s, err := dp.Verify(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range reported {
			if _, ok := s.Find(c.Hash); !ok {
				t.Fatalf("round %d: fsync'd entry %d (%s) was lost", round, c.Seq, c.Hash.Short())
			}
		}
		t.Logf("round %d: killed after %d reported charges; ledger has %d entries, torn tail %d bytes", round, len(reported), s.Len(), s.TornBytes)
	}
	code, out, stderr := scellisRun(ctx, t, "--json", "ledger", "charge", "--ledger", path, "--dataset", "icu",
		"--consumer", "after", "--sigma", "5", "--q", "0.001", "--steps", "1")
	if code != 0 {
		t.Fatalf("charge after the kills: exit %d: %s", code, stderr)
	}
	last := parseChargeLines(t, out)[0]
	s, _ := dp.Verify(path, nil)
	if s.Head() != last.Hash {
		t.Fatalf("the last charge is not the ledger's head")
	}
}
