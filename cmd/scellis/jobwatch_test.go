package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
)

// fakeWatch drives a jobWatch with a fake clock: seconds since the watch
// began.
type fakeWatch struct {
	t   *testing.T
	s   *jobWatch
	out bytes.Buffer
	t0  time.Time
	id  content.Ref
}

func newFakeWatch(t *testing.T, tty bool, width int) *fakeWatch {
	f := &fakeWatch{t: t, t0: time.Unix(1_700_000_000, 0), id: content.Hash([]byte("job"))}
	f.s = newJobWatch(&f.out, f.id, f.t0, tty, width)
	return f
}

func (f *fakeWatch) at(sec float64) time.Time {
	return f.t0.Add(time.Duration(sec * float64(time.Second)))
}

// send delivers e (a coordinator event, or a JobStatus as the stream's
// "status") as the client would: kind and JSON data.
func (f *fakeWatch) send(sec float64, e any) {
	f.t.Helper()
	kind := "status"
	if ce, ok := e.(coordinator.Event); ok {
		kind = ce.Kind()
	}
	b, err := json.Marshal(e)
	if err != nil {
		f.t.Fatal(err)
	}
	f.s.event(f.at(sec), api.Event{Kind: kind, Data: b})
}

func (f *fakeWatch) running(sec float64, total, verified int) {
	f.send(sec, coordinator.JobStatus{ID: f.id, Name: "sweep", State: coordinator.JobRunning, Counts: coordinator.Counts{Total: total, Verified: verified, Pending: total - verified}})
}

func (f *fakeWatch) lines() []string {
	return strings.Split(strings.TrimSuffix(f.out.String(), "\n"), "\n")
}

// A 1,000-shard job at 10 shards/s for 10 s, then 20 shards/s: a line
// every 5 s with the recent and overall rates, the ETA from the recent
// rate, and the leases since the line before; the out-voted shard on a
// line of its own; the summary with the wall time, mean shards/s and the
// job's leases.
func TestJobWatchSummarisesProgress(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	f.running(0, 1000, 0)
	shard := 0
	for sec := 1; sec <= 55; sec++ {
		n := 20
		if sec <= 10 {
			n = 10
		}
		for i := range n {
			at := float64(sec-1) + (float64(i)+0.5)/float64(n)
			f.send(at, coordinator.ShardLeased{Job: f.id, Shard: shard, Peer: "w1"})
			v := coordinator.ShardVerified{Job: f.id, Shard: shard, Agreeing: []string{"w1", "w2"}, Receipt: uint64(shard + 1)}
			if shard == 500 {
				v.Losers = []string{"w9"}
			}
			f.send(at, v)
			shard++
		}
		if sec%10 == 0 {
			// Churn: a lease handed back and one lapsed, both leased again.
			for _, r := range []coordinator.LeaseEnd{coordinator.LeaseReleased, coordinator.LeaseExpired} {
				f.send(float64(sec)-0.01, coordinator.LeaseEnded{Job: f.id, Shard: shard, Peer: "w3", Reason: r})
				f.send(float64(sec)-0.01, coordinator.ShardLeased{Job: f.id, Shard: shard, Peer: "w1"})
			}
		}
		f.s.tick(f.at(float64(sec)))
	}
	f.send(55.2, coordinator.AllShardsDecided{Job: f.id, Verified: 1000})
	f.s.tick(f.at(56))
	f.send(56, coordinator.JobComplete{Job: f.id, Reduced: content.Hash([]byte("result")), Reducer: "w2"})
	f.s.stop(f.at(56.5)) // the stream ended after job-complete: nothing more

	lines := f.lines()
	t.Logf("%d lines:\n%s", len(lines), f.out.String())
	want := map[string]bool{
		"job sweep (" + f.id.Short() + "): running; 0/1000 verified, 0 flagged, 0 leased":                                                                                      false,
		"  [5s] 50/1000 decided (50 verified, 0 unverified); 10.0 shards/s (last 5s), 10.0 overall; ETA 1m35s; leases: 50 granted in the last 5s":                              false,
		"  [10s] 100/1000 decided (100 verified, 0 unverified); 10.0 shards/s (last 10s), 10.0 overall; ETA 1m30s; leases: 52 granted, 1 handed back, 1 lapsed in the last 5s": false,
		"  [20s] 300/1000 decided (300 verified, 0 unverified); 20.0 shards/s (last 10s), 15.0 overall; ETA 35s; leases: 102 granted, 1 handed back, 1 lapsed in the last 5s":  false,
		"  shard 500 verified by w1, w2; out-voted: w9":                                                                                          false,
		"all shards decided: 1000 verified, 0 unverified; reducing":                                                                              false,
		"job complete: result " + content.Hash([]byte("result")).Short() + " (reduced by w2)":                                                    false,
		"done in 56s: 1000/1000 shards decided (1000 verified, 0 unverified), 17.9 shards/s mean; leases: 1010 granted, 5 handed back, 5 lapsed": false,
	}
	progress := 0
	for _, l := range lines {
		if _, ok := want[l]; ok {
			want[l] = true
		}
		if strings.HasPrefix(l, "  [") {
			progress++
		}
	}
	for l, seen := range want {
		if !seen {
			t.Errorf("no line %q", l)
		}
	}
	// 1,000 shards and 1,020 lease events: a line every 5 s (11 in 55 s),
	// plus the header, one out-voted shard and the three closing lines.
	if progress != 11 || len(lines) != 16 {
		t.Errorf("%d progress lines and %d in all, want 11 and 16", progress, len(lines))
	}
	if lines[len(lines)-1] != "done in 56s: 1000/1000 shards decided (1000 verified, 0 unverified), 17.9 shards/s mean; leases: 1010 granted, 5 handed back, 5 lapsed" {
		t.Errorf("the last line is %q, want the summary", lines[len(lines)-1])
	}
}

// A job of 10,000 shards at 5 shards/s (33 minutes) logs tens of lines:
// the interval grows with the time watched, to a minute.
func TestJobWatchLongJobLogsTensOfLines(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	f.running(0, 10000, 0)
	for sec := 1; sec <= 2000; sec++ {
		for i := range 5 {
			at := float64(sec-1) + (float64(i)+0.5)/5
			f.send(at, coordinator.ShardLeased{Job: f.id, Shard: (sec-1)*5 + i, Peer: "w1"})
			f.send(at, coordinator.ShardVerified{Job: f.id, Shard: (sec-1)*5 + i, Agreeing: []string{"w1"}})
		}
		f.s.tick(f.at(float64(sec)))
	}
	f.send(2000, coordinator.AllShardsDecided{Job: f.id, Verified: 10000})
	f.send(2001, coordinator.JobComplete{Job: f.id, Reduced: content.Hash([]byte("result")), Reducer: "w1"})
	lines := f.lines()
	t.Logf("%d lines; the last five:\n%s", len(lines), strings.Join(lines[len(lines)-5:], "\n"))
	if len(lines) < 20 || len(lines) > 70 {
		t.Errorf("%d lines for a 33-minute job, want tens:\n%s", len(lines), f.out.String())
	}
	var prev time.Duration
	for _, l := range lines {
		if m := regexp.MustCompile(`^  \[(\S+)\] `).FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatal(err)
			}
			if gap := d - prev; gap > watchLogMax+time.Second {
				t.Errorf("%v between two lines at %v, want at most %v", gap, d, watchLogMax)
			}
			prev = d
		}
	}
	if last := lines[len(lines)-1]; last != "done in 33m21s: 10000/10000 shards decided (10000 verified, 0 unverified), 5.0 shards/s mean; leases: 10000 granted" {
		t.Errorf("last line %q", last)
	}
}

// A cancel flags every open shard at once: five are printed, the rest
// counted on one line, before the cancel and the summary (no rate: the
// flagged shards were not run).
func TestJobWatchCapsRepeatedEvents(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	f.running(0, 100, 0)
	for i := range 10 {
		f.send(1, coordinator.ShardVerified{Job: f.id, Shard: i, Agreeing: []string{"w1"}})
	}
	reason := "job cancelled by alice: enough"
	for i := 10; i < 100; i++ {
		f.send(3, coordinator.ShardFlagged{Job: f.id, Shard: i, Reason: reason})
	}
	f.send(3, coordinator.JobCancelled{Job: f.id, Peer: "alice", Reason: "enough"})
	f.s.stop(f.at(3))
	want := []string{
		"job sweep (" + f.id.Short() + "): running; 0/100 verified, 0 flagged, 0 leased",
		"  shard 10 UNVERIFIED after 0 reports: " + reason,
		"  shard 11 UNVERIFIED after 0 reports: " + reason,
		"  shard 12 UNVERIFIED after 0 reports: " + reason,
		"  shard 13 UNVERIFIED after 0 reports: " + reason,
		"  shard 14 UNVERIFIED after 0 reports: " + reason,
		"  … and 85 more shards unverified (" + reason + ")",
		"job cancelled by alice: enough",
		"cancelled after 3s: 100/100 shards decided (10 verified, 90 unverified)",
	}
	if got := f.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Watching a job that ended: its status, its result, and its wall time by
// the pool's clock (the watch saw none of it).
func TestJobWatchFinishedJob(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	reduced := content.Hash([]byte("r"))
	f.send(0, coordinator.JobStatus{ID: f.id, Name: "mc", State: coordinator.JobDone, SubmittedAt: 1_000_000, DoneAt: 1_004_000,
		Counts: coordinator.Counts{Total: 4, Verified: 4}, Reduced: reduced, Reducer: "worker-2"})
	f.s.stop(f.at(0.1))
	want := "job mc (" + f.id.Short() + "): done; 4/4 verified, 0 flagged, 0 leased\n" +
		"job complete: result " + reduced.Short() + " (reduced by worker-2)\n" +
		"done in 4s by the pool's clock: 4/4 shards decided (4 verified, 0 unverified), 1.0 shards/s mean\n"
	if f.out.String() != want {
		t.Errorf("got\n%swant\n%s", f.out.String(), want)
	}
}

// A reconnect's status replaces the counts (events were missed meanwhile);
// an event already in the first status does not count twice; an interrupt
// ends with the summary so far.
func TestJobWatchReconnectAndInterrupt(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	f.running(0, 10, 2)
	f.send(0.1, coordinator.ShardVerified{Job: f.id, Shard: 0, Agreeing: []string{"w1"}}) // in the status already? counted: 3 ≤ 10
	f.running(4, 10, 7)
	for i := 7; i < 12; i++ { // two more than the job has: the last two were in the status
		f.send(4.5, coordinator.ShardVerified{Job: f.id, Shard: i % 10, Agreeing: []string{"w1"}})
	}
	if d := f.s.decided(); d != 10 {
		t.Fatalf("decided %d, want 10", d)
	}
	f.s.stop(f.at(8))
	last := f.lines()[len(f.lines())-1]
	if want := "stopped watching after 8s (the watch began with 2 shards decided): 10/10 shards decided (10 verified, 0 unverified), 1.0 shards/s mean"; last != want {
		t.Errorf("last line %q, want %q", last, want)
	}
}

// A spot check that catches a peer after all shards were decided: the
// exclusion, the reopened shard and the reversed receipt each get a line,
// and the progress lines resume until the re-check decides the shard.
func TestJobWatchSpotCheckEvents(t *testing.T) {
	f := newFakeWatch(t, false, 0)
	f.running(0, 2, 0)
	f.send(1, coordinator.ShardVerified{Job: f.id, Shard: 0, Agreeing: []string{"w1"}, Receipt: 1})
	f.send(1, coordinator.ShardVerified{Job: f.id, Shard: 1, Agreeing: []string{"liar"}, Receipt: 2})
	f.send(1, coordinator.AllShardsDecided{Job: f.id, Verified: 2})
	f.send(2, coordinator.PeerCaught{Job: f.id, Shard: 1, Peer: "liar", Offences: 3, Excluded: true})
	f.send(2, coordinator.ShardReopened{Job: f.id, Shard: 1, Suspect: "liar"})
	f.send(2, coordinator.ReceiptReversed{Job: f.id, Shard: 1, Receipt: 2, Reversal: 3})
	f.s.tick(f.at(5))
	f.send(6, coordinator.ShardVerified{Job: f.id, Shard: 1, Agreeing: []string{"w1"}, Receipt: 4})
	f.send(6, coordinator.AllShardsDecided{Job: f.id, Verified: 2})
	f.send(7, coordinator.JobComplete{Job: f.id, Reducer: "w1"})
	got := f.out.String()
	for _, want := range []string{
		"\n  peer liar EXCLUDED from the pool after 3 offences (shard 1: its result differed from the verified one)\n",
		"\n  shard 1 reopened for a re-check: liar, who vouched for it, was caught\n",
		"\n  shard 1: receipt 2 reversed by receipt 3 (its result was found wrong)\n",
		"\n  [5s] 1/2 decided (1 verified, 0 unverified); ",
		"\ndone in 7s: 2/2 shards decided (2 verified, 0 unverified), 0.29 shards/s mean\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
}

// On a terminal the line is redrawn in place, cut to the terminal's
// width; a note is written over it on a line of its own, and the summary
// ends the output on a fresh line.
func TestJobWatchTerminalRedrawsOneLine(t *testing.T) {
	const width = 60
	f := newFakeWatch(t, true, width)
	f.running(0, 40, 0)
	for sec := 1; sec <= 20; sec++ {
		f.send(float64(sec)-0.5, coordinator.ShardLeased{Job: f.id, Shard: sec - 1, Peer: "w1"})
		f.send(float64(sec)-0.5, coordinator.ShardVerified{Job: f.id, Shard: sec - 1, Agreeing: []string{"w1"}})
		if sec == 7 {
			f.send(7, coordinator.ShardFlagged{Job: f.id, Shard: 39, Reports: 3, Reason: "no two results agree"})
		}
		f.s.tick(f.at(float64(sec)))
	}
	f.s.stop(f.at(20.5))
	out := f.out.String()
	if n := strings.Count(out, "\r"); n < 20 {
		t.Errorf("%d carriage returns, want a redraw a second", n)
	}
	blank := func(s string) bool { return strings.Trim(s, " ") == "" }
	segs := strings.FieldsFunc(out, func(r rune) bool { return r == '\r' || r == '\n' })
	for i, seg := range segs {
		if strings.Contains(seg, "\x1b") {
			t.Errorf("an escape sequence in %q: a dumb terminal shows it", seg)
		}
		if strings.HasPrefix(seg, "  [") && len([]rune(seg)) > width-1 {
			t.Errorf("a progress line of %d columns on a %d-column terminal: %q", len([]rune(seg)), width, seg)
		}
		// A line that stays is written over a blanked progress line.
		if strings.HasPrefix(seg, "  shard 39 ") || strings.HasPrefix(seg, "stopped watching") {
			if i < 2 || !blank(segs[i-1]) || len(segs[i-1]) < len([]rune(segs[i-2])) {
				t.Errorf("%q is not written over a blanked progress line", seg)
			}
		}
	}
	if !strings.Contains(out, "\r  shard 39 UNVERIFIED after 3 reports: no two results agree\n") {
		t.Errorf("the note is not on a line of its own:\n%q", out)
	}
	if !strings.Contains(out, "\r  [20s] 21/40 decided (20 verified, 1 unverified); 1.0") {
		t.Errorf("no progress line at 20 s:\n%q", out)
	}
	if !strings.HasSuffix(out, "\rstopped watching after 20.5s: 21/40 shards decided (20 verified, 1 unverified), 1.0 shards/s mean; leases: 20 granted\n") {
		t.Errorf("the output does not end with the summary on its own line:\n%q", out)
	}
}

// The rate and duration formats the lines use.
func TestJobWatchFormats(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", 1400 * time.Millisecond: "1s", 59 * time.Second: "59s", 185 * time.Second: "3m05s", 62*time.Minute + 20*time.Second: "1h02m"} {
		if got := fmtWatchDur(d); got != want {
			t.Errorf("fmtWatchDur(%v) = %q, want %q", d, got, want)
		}
	}
	for r, want := range map[float64]string{0: "0.00", 0.25: "0.25", 4.32: "4.3", 2140.4: "2140"} {
		if got := fmtRate(r); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", r, got, want)
		}
	}
	if got := fmt.Sprint(leaseCounts{granted: 120, released: 3, expired: 1}); got != "120 granted, 3 handed back, 1 lapsed" {
		t.Errorf("lease summary %q", got)
	}
	// Under a second with a shard left, the ETA is "<1s": "0s" reads as done.
	f := newFakeWatch(t, false, 0)
	f.running(0, 21, 0)
	for i := range 20 {
		f.send(0.5, coordinator.ShardVerified{Job: f.id, Shard: i, Agreeing: []string{"w1"}})
	}
	if got := f.s.progress(f.at(1), leaseCounts{}, time.Second); !strings.Contains(got, "; ETA <1s;") {
		t.Errorf("one shard left at 20 shards/s: %q", got)
	}
}
