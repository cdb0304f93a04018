package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
)

// badInputBound is a hang detector, not a timing assertion: every bad input
// must be refused long before it.
const badInputBound = 20 * time.Second

// TestBadInputCorpus drives the real binary with the inputs that used to
// crash or hang it (testdata/badinput, plus FIFOs, /dev/zero and oversized
// files made here) and checks each is refused with its exit code and
// diagnostic code within badInputBound.
func TestBadInputCorpus(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	bin := scellisBinary(t)
	dir := t.TempDir()
	src := filepath.Join("testdata", "badinput")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(entries) < 10 {
		t.Fatalf("the corpus holds %d files; it lost some", len(entries))
	}
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A config over the 1 MiB limit (the 100 MB config ran out of
	// memory; the size is what is refused, so 2 MiB shows it).
	write("huge.yaml", "name: w1\n#"+strings.Repeat("x", 2<<20)+"\n")
	job, err := os.ReadFile(filepath.Join(dir, "job-nan.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	write("job-fifo-input.yaml", strings.Replace(string(job), "path: nan.csv", "path: fifo", 1))
	write("job-devzero-input.yaml", strings.Replace(string(job), "path: nan.csv", "path: /dev/zero", 1))
	writeReceiptVariants(t, dir)
	write("job-audit-rate.yaml", "name: x\nprogram: montecarlo_pi\npartitioner: seeds\nverification:\n  mode: adaptive\n  audit_one_in: 0\n")

	cases := []struct {
		name string
		args []string
		exit int
		code string
	}{
		{"yaml bomb in a job", []string{"run", "bomb-job.yaml"}, 2, "SC1008"},
		{"yaml bomb in a config", []string{"config", "check", "--kind", "worker", "bomb-config.yaml"}, 2, "SC1008"},
		{"huge config", []string{"config", "check", "--kind", "worker", "huge.yaml"}, 2, "SC1005"},
		{"config is a fifo", []string{"config", "check", "--kind", "worker", "fifo"}, 2, "SC1006"},
		{"config is /dev/zero", []string{"config", "check", "--kind", "silo", "/dev/zero"}, 2, "SC1006"},
		{"job is a fifo", []string{"run", "fifo"}, 2, "SC1006"},
		{"job is /dev/zero", []string{"run", "/dev/zero"}, 2, "SC1006"},
		{"dataset is a fifo", []string{"run", "job-fifo-input.yaml"}, 2, "SC1006"},
		{"dataset is /dev/zero", []string{"run", "job-devzero-input.yaml"}, 2, "SC1006"},
		{"ledger is a fifo", []string{"ledger", "verify", "--ledger", "fifo"}, 2, "SC5018"},
		{"ledger is /dev/zero", []string{"ledger", "verify", "--ledger", "/dev/zero"}, 2, "SC5018"},
		{"ledger to repair is a fifo", []string{"ledger", "repair", "--ledger", "fifo"}, 2, "SC5018"},
		{"model file is a fifo", []string{"model", "eval", "fifo", "--data", "ok.csv"}, 2, "SC9401"},
		{"receipts are a fifo", []string{"receipts", "verify", "--file", "fifo"}, 2, "SC1006"},
		{"receipts are /dev/zero", []string{"receipts", "verify", "--file", "/dev/zero"}, 2, "SC1006"},
		{"NaN in a dataset", []string{"run", "job-nan.yaml"}, 2, "SC3004"},
		{"Inf in a dataset", []string{"run", "job-inf.yaml"}, 2, "SC3004"},
		{"ragged dataset", []string{"run", "job-ragged.yaml"}, 2, "SC3002"},
		{"NaN in a silo's dataset", []string{"config", "check", "--kind", "silo", "silo-nan.yaml"}, 2, "SC3004"},
		{"infinite budget", []string{"config", "check", "--kind", "silo", "silo-inf-budget.yaml"}, 2, "SC1005"},
		{"huge allocation in one step", []string{"run", "job-alloc.yaml"}, 2, "SC2005"},
		{"endless native", []string{"run", "job-endless.yaml"}, 2, "SC2004"},
		{"receipt edited", []string{"receipts", "verify", "--file", "receipts-edited.json"}, 2, "SC7013"},
		{"receipts dropped from the end", []string{"receipts", "verify", "--file", "receipts-short.json", "--head", readFile(t, dir, "receipts-head")}, 2, "SC7013"},
		{"receipt with an unknown key", []string{"receipts", "verify", "--file", "receipts-unknown-key.json"}, 2, "SC7014"},
		{"receipt with a case-changed key", []string{"receipts", "verify", "--file", "receipts-case.json"}, 2, "SC7014"},
		{"receipt with a repeated key", []string{"receipts", "verify", "--file", "receipts-dup.json"}, 2, "SC7014"},
		{"spot-check audit rate out of range", []string{"run", "job-audit-rate.yaml"}, 2, "SC1005"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exit, stdout, stderr := runBounded(t, bin, dir, c.args...)
			if exit != c.exit || !strings.Contains(stderr, "error["+c.code+"]") {
				t.Fatalf("%v: exit %d, want %d with %s\nstdout:\n%s\nstderr:\n%s", c.args, exit, c.exit, c.code, stdout, stderr)
			}
		})
	}

	t.Run("broken chain verdict in JSON", func(t *testing.T) {
		exit, stdout, stderr := runBounded(t, bin, dir, "receipts", "verify", "--json", "--file", "receipts-edited.json")
		var v struct {
			Intact bool `json:"intact"`
			Bad    struct {
				Code string `json:"code"`
				Seq  int    `json:"seq"`
			} `json:"bad_receipt"`
		}
		if err := json.Unmarshal([]byte(stdout), &v); err != nil || exit != 2 || v.Intact || v.Bad.Code != "SC7013" || v.Bad.Seq != 2 {
			t.Fatalf("exit %d, verdict %+v (%v)\nstdout:\n%s\nstderr:\n%s", exit, v, err, stdout, stderr)
		}
	})
	t.Run("intact chain with its head", func(t *testing.T) {
		exit, stdout, stderr := runBounded(t, bin, dir, "receipts", "verify", "--file", "receipts.json", "--head", readFile(t, dir, "receipts-head"))
		if exit != 0 || !strings.Contains(stdout, "intact: 3 receipts") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", exit, stdout, stderr)
		}
	})

	// SIGINT reaches a native in the middle of its loop: the run ends with
	// SC2015 instead of training forever.
	t.Run("SIGINT stops an endless native", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), badInputBound)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "run", "job-endless-nolimit.yaml")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The plan line is printed after the signal handler is installed
		// and before the shard runs.
		sc := bufio.NewScanner(out)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "job ") {
		}
		cmd.Process.Signal(os.Interrupt)
		for sc.Scan() {
		}
		err = cmd.Wait()
		if ctx.Err() != nil {
			t.Fatalf("scellis run ignored SIGINT for %v", badInputBound)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "error[SC2015]") {
			t.Fatalf("exit %v, want 2 with SC2015\nstderr:\n%s", err, stderr.String())
		}
	})
}

// runBounded runs the binary in dir and fails the test if it does not exit
// within badInputBound.
func runBounded(t *testing.T, bin, dir string, args ...string) (exit int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), badInputBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v did not exit within %v (a hang)\nstderr:\n%s", args, badInputBound, e.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		exit = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return exit, o.String(), e.String()
}

func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// writeReceiptVariants writes an intact three-receipt export, its head, and
// the broken variants: an edited receipt, the last one dropped, an unknown
// key, a key in another case and a repeated key.
func writeReceiptVariants(t *testing.T, dir string) {
	t.Helper()
	c, err := receipt.NewChain(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r := c.Next(receipt.Receipt{
			Job: content.Hash([]byte("job")), Shard: content.Hash([]byte{byte(i)}), ShardIndex: i,
			Result: content.Hash([]byte{'r', byte(i)}), Peers: []string{"w1", "w2"}, Method: "quorum-2-exact",
			WorkUnits: 10, PriceBasis: "program cost()", LeaderTime: 1700000000000 + int64(i),
		})
		if err := c.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	rs := c.All()
	put := func(name string, v any) {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("receipts.json", rs)
	_, head := c.Head()
	if err := os.WriteFile(filepath.Join(dir, "receipts-head"), []byte(head), 0o644); err != nil {
		t.Fatal(err)
	}
	edited := c.All()
	edited[1].WorkUnits = 1000
	put("receipts-edited.json", edited)
	put("receipts-short.json", rs[:2])
	good, _ := json.MarshalIndent(rs, "", "  ")
	for name, edit := range map[string]func(string) string{
		"receipts-unknown-key.json": func(s string) string { return strings.Replace(s, `"seq": 2,`, `"seq": 2, "bonus": 1,`, 1) },
		"receipts-case.json":        func(s string) string { return strings.Replace(s, `"work_units": 10`, `"Work_Units": 10`, 1) },
		"receipts-dup.json": func(s string) string {
			return strings.Replace(s, `"work_units": 10`, `"work_units": 10, "work_units": 1000`, 1)
		},
	} {
		s := edit(string(good))
		if s == string(good) {
			t.Fatalf("%s: the edit changed nothing", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
