package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A federation round at real model sizes, as a user runs it (issue 32):
// the federation of BenchmarkFLRoundProcesses (three aggregators, four
// silo processes, update-level DP and secure aggregation, launched with
// `scellis fl launch`), training a one-hidden-layer MLP of d parameters
// for one SGD step of 32 rows per site. It reports, per size, the round's
// wall time by the leader's clock and the peak resident memory (VmHWM) of
// the largest silo and the largest aggregator, as multiples of the model's
// bytes (d float64s) and as bytes per parameter above what the process
// held before the run (its VmRSS when the federation was idle); for the
// larger sizes also the slope against the smallest size's peak in the same
// run (-slope-B/param: what each further parameter costs, free of what any
// first round costs: caches, connections, the interpreter).
//
//	go test -run x -bench FLModelSize -benchtime 1x ./cmd/scellis/
//
// Each size starts its own federation, so each peak is that size's.
// d=1e+06/n=10 is the largest size with ten silos instead of four: an
// aggregator's peak must not grow with the sites (it sums each masked
// input into one accumulator as it arrives).
// Under -short (CI runs every benchmark once that way) only d=1e3 runs:
// the larger sizes are the same round with a bigger model.
func BenchmarkFLModelSize(b *testing.B) {
	// The smallest size's peaks, for the slope of each larger size.
	var small procMemory
	smallD := 0
	for _, sz := range []struct{ d, silos int }{{1_000, 4}, {100_000, 4}, {1_000_000, 4}, {1_000_000, 10}} {
		d := sz.d
		name := fmt.Sprintf("d=%.0e", float64(d))
		if sz.silos != 4 {
			name += fmt.Sprintf("/n=%d", sz.silos)
		}
		b.Run(name, func(b *testing.B) {
			if testing.Short() && d > 1_000 {
				b.Skipf("-short: d=%d skipped (d=1000 runs the same round)", d)
			}
			f := startFLBenchFederation(b, sz.silos)
			idle := f.rss(b, "VmRSS")
			var wall time.Duration
			params := 0
			for i := 0; i < b.N; i++ {
				f.runs++
				spec, p := f.writeSizedSpec(d)
				params = p
				wall += f.runOne(b, spec, 1)
			}
			peak := f.rss(b, "VmHWM")
			model := float64(params * 8)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(params), "d")
			b.ReportMetric(float64(wall.Microseconds())/1e3/float64(b.N), "round-ms")
			for _, role := range []string{"silo", "agg"} {
				p, base := peak.max(role), idle.max(role)
				b.ReportMetric(float64(p)/model, role+"-peak/model")
				b.ReportMetric(float64(p-base)/float64(params), role+"-B/param")
				b.ReportMetric(float64(p)/(1<<20), role+"-peak-MiB")
				if small != nil && params > smallD {
					b.ReportMetric(float64(p-small.max(role))/float64(params-smallD), role+"-slope-B/param")
				}
			}
			if small == nil && d == 1_000 {
				small, smallD = peak, params
			}
		})
	}
}

// mlpHidden is the least hidden width that gives a one-hidden-layer binary
// MLP over inputs features at least d parameters (hidden·(inputs+2)+1),
// and the parameters it has.
func mlpHidden(d, inputs int) (hidden, params int) {
	hidden = max(1, (d-1+inputs+1)/(inputs+2))
	return hidden, hidden*(inputs+2) + 1
}

// writeSizedSpec writes the next run's spec: an MLP of at least d
// parameters on the hospitals' nine features, one SGD step of 32 rows.
func (f *flBenchFederation) writeSizedSpec(d int) (path string, params int) {
	hidden, params := mlpHidden(d, 9)
	name := fmt.Sprintf("run-%d.yaml", f.runs)
	f.c.write(name, fmt.Sprintf(`name: size-%d
strategy: {use: fedavg, params: {lr: 0.5, steps: 1, batch_size: 32}}
model: {kind: mlp, inputs: 9, hidden: %d, classes: 2, label: outcome}
dataset: patients
rounds: 1
privacy: {clip: 1.0, sigma: 1.0}
standardize: local
secure_aggregation: true
seed: %d
`, f.runs, hidden, f.runs))
	return filepath.Join(f.c.dir, name), params
}

// runOne launches spec, waits for it to be done with its rounds and
// returns its time by the leader's replicated clock.
func (f *flBenchFederation) runOne(tb testing.TB, spec string, rounds int) time.Duration {
	tb.Helper()
	id := strings.TrimSpace(f.c.mustCLI("alice", "fl", "launch", spec))
	f.c.mustCLI("alice", "fl", "watch", id)
	var st struct {
		State     string `json:"state"`
		StartedAt int64  `json:"started_at"`
		DoneAt    int64  `json:"done_at"`
		Models    []string
	}
	raw := f.c.mustCLI("alice", "--json", "fl", "status", id)
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		tb.Fatal(err)
	}
	if st.State != "done" || len(st.Models) != rounds || st.StartedAt <= 0 || st.DoneAt < st.StartedAt {
		tb.Fatalf("run %s ended %s with %d of %d rounds:\n%s", id, st.State, len(st.Models), rounds, raw)
	}
	return time.Duration(st.DoneAt-st.StartedAt) * time.Millisecond
}

// procMemory is a figure of /proc/<pid>/status (bytes) per process name.
type procMemory map[string]int64

// max is the largest figure among the processes whose name starts with
// prefix ("silo", "agg").
func (m procMemory) max(prefix string) int64 {
	var top int64
	for name, v := range m {
		if strings.HasPrefix(name, prefix) {
			top = max(top, v)
		}
	}
	return top
}

// rss reads field (VmRSS: resident now; VmHWM: the peak) of every process
// of the federation.
func (f *flBenchFederation) rss(tb testing.TB, field string) procMemory {
	tb.Helper()
	out := procMemory{}
	for name, cmd := range f.c.procs {
		v, err := procStatus(cmd.Process.Pid, field)
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		out[name] = v
	}
	return out
}

// procStatus reads one "Field: N kB" line of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	s := bufio.NewScanner(fh)
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
		}
		return kb << 10, nil
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}
