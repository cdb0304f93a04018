package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// addressSpaceKiB is the address-space limit (ulimit -v) the inputs below
// are sized against: the binary starts under it with room for about
// 70 MiB of heap, and each input needs several times that when read whole.
const addressSpaceKiB = 1_000_000

// Inputs that need more memory than the process may have end in a
// diagnostic (exit 2 and its code), never in the Go runtime's fatal
// out-of-memory: under an address-space limit, a receipt export of empty
// objects, one of whole receipts too many to hold, train-eval and model
// eval on a CSV of 10^6 columns and on one of 50,000 columns with more rows
// than fit, a model file of 20 million parameters, and a program whose
// list grows without end, all through the real binary. (A string doubled
// in one step can still outrun the guard: one operation allocates before
// any check, script/memguard.go.)
func TestMemoryExhaustionIsADiagnostic(t *testing.T) {
	if testing.Short() {
		t.Skip("writes about 110 MB of inputs")
	}
	bin := scellisBinary(t)
	dir := t.TempDir()
	limited := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -v %d; exec "$0" "$@"`, addressSpaceKiB), bin}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis"))
		var errb strings.Builder
		cmd.Stderr = &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), errb.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, errb.String()
	}
	if exit, errs := limited("version"); exit != 0 {
		t.Skipf("the Go runtime does not start under ulimit -v %d on this machine: %s", addressSpaceKiB, errs)
	}
	write := func(name string, fill func(w *bufio.Writer)) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriterSize(f, 1<<20)
		fill(w)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("empty.json", func(w *bufio.Writer) { // 40 MB of {}: each one a whole receipt in memory
		w.WriteString("[{}")
		for range 40 << 20 / 3 {
			w.WriteString(",{}")
		}
		w.WriteString("]")
	})
	// Whole receipts whose peer lists hold five times their bytes in
	// memory: 80 MB of them need more than any limit left under
	// addressSpaceKiB (the derived limit depends on the runtime's
	// reservations at start, 70 MiB here, at most about 190).
	h := "sha256:" + strings.Repeat("ab", 32)
	peers := make([]string, 2000)
	for i := range peers {
		peers[i] = fmt.Sprintf("%q", fmt.Sprintf("%02x", i%256))
	}
	rec := fmt.Sprintf(`{"seq":1,"prev":%q,"job":%q,"shard":%q,"shard_index":0,"result":%q,"peers":[%s],"method":"quorum-2-exact","work_units":1,"price_basis":"program cost()","leader_time":1,"hash":%q}`,
		h, h, h, h, strings.Join(peers, ","), h)
	write("receipts.json", func(w *bufio.Writer) {
		w.WriteString("[" + rec)
		for range 80 << 20 / len(rec) {
			w.WriteString("," + rec)
		}
		w.WriteString("]")
	})
	csv := func(name string, cols, rows int) {
		write(name, func(w *bufio.Writer) {
			for i := range cols {
				fmt.Fprintf(w, "c%d,", i)
			}
			w.WriteString("outcome\n")
			row := strings.Repeat("0,", cols)
			for r := range rows {
				fmt.Fprintf(w, "%s%d\n", row, r%2)
			}
		})
	}
	csv("wide.csv", 1_000_000, 5)
	csv("tall.csv", 50_000, 200) // 10^7 values: 80 MB, four copies 320 MB
	for _, data := range []string{"wide", "tall"} {
		write(data+".yaml", func(w *bufio.Writer) {
			fmt.Fprintf(w, "name: %s\nprogram: train-eval\npartitioner: {use: grid, params: {lr: [0.1]}}\nreducer: {use: collect, params: {metric: auc, goal: max}}\n"+
				"params: {model: logistic, epochs: 1, batch_size: 32, test_frac: 0.25, seed: 1}\ninputs:\n  data: {path: %s.csv, label: outcome, class: confidential}\n", data, data)
		})
	}
	write("model.json", func(w *bufio.Writer) {
		w.WriteString(`{"format": "scellis/model/v3", "kind": "logistic", "inputs": 2, "classes": [0, 1], "features": ["c0", "c1"], "label": "outcome",
  "standardization": {"mode": "none"}, "params": [2, -1, 0], "layout": {"weights": [0, 2], "bias": [2, 1], "outputs": 1, "params": 3},
  "run": {"id": "", "name": "by hand", "state": "done", "spec": null}, "rounds": [], "privacy": [],
  "refs": {"run": "", "strategy": "", "model": "", "round_results": [], "round_jobs": [], "receipts": []}}`)
	})
	write("big-model.json", func(w *bufio.Writer) { // 40 MB of parameters
		w.WriteString(`{"format": "scellis/model/v3", "kind": "logistic", "inputs": 2, "params": [0`)
		for range 20 << 20 {
			w.WriteString(",0")
		}
		w.WriteString("]}")
	})
	// What the limit leaves at start varies by one 64 MiB heap arena the
	// runtime may or may not have reserved during package initialisation:
	// under this limit the derived soft limit is about 70 MiB in most
	// starts and 22 MiB in some (measured: 11 of 12 and 1 of 12). Under
	// the smaller one an input can be refused as too large for the limit
	// (SC1206) before the check that names its own fault is reached (a
	// header of a million columns, SC3007; a list of empty receipts,
	// SC7014). Either is the diagnostic this test asks for: exit 2 with a
	// code, never the runtime's fatal error.
	const wideCodes = "SC3007|SC1206"
	// A program whose list grows past what the limit leaves: the call's
	// memory budget is lowered to that room, so the guard stops it
	// (SC2005) before the runtime would die of it.
	write("grow.star", func(w *bufio.Writer) {
		w.WriteString("def run(params, inputs):\n    x = []\n    for i in range(200000000):\n        x.append(i)\n    return {\"n\": len(x)}\n")
	})
	write("grow.yaml", func(w *bufio.Writer) {
		w.WriteString("name: grow\nprogram: ./grow.star\npartitioner: {use: items, params: {items: [{a: 1}]}}\nreducer: concat\n")
	})
	for _, c := range []struct {
		args []string
		code string
	}{
		{[]string{"receipts", "verify", "--file", "empty.json"}, "SC7014|SC1206"},
		{[]string{"run", "grow.yaml", "--out", "out-grow"}, "SC2005"},
		{[]string{"receipts", "verify", "--file", "receipts.json"}, "SC1206"},
		{[]string{"run", "wide.yaml", "--out", "out-wide"}, wideCodes},
		{[]string{"model", "eval", "model.json", "--data", "wide.csv"}, wideCodes},
		{[]string{"run", "tall.yaml", "--out", "out-tall"}, "SC1206"},
		{[]string{"model", "eval", "model.json", "--data", "tall.csv"}, "SC1206"},
		{[]string{"model", "eval", "big-model.json", "--data", "tall.csv"}, "SC1206"},
	} {
		exit, errs := limited(c.args...)
		coded := false
		for _, code := range strings.Split(c.code, "|") {
			coded = coded || strings.Contains(errs, "error["+code+"]")
		}
		if exit != 2 || !coded || strings.Contains(errs, "fatal error") {
			t.Errorf("scellis %s under ulimit -v %d: exit %d, want 2 with %s and no fatal error:\n%.2000s", strings.Join(c.args, " "), addressSpaceKiB, exit, c.code, errs)
		}
	}
}
