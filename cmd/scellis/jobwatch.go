package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
)

// The human output of `job watch` and `job submit --watch` is a progress
// line, not a line per event: a busy pool decides thousands of shards and
// grants as many leases a minute, and a line each buried the few events
// a person has to see (a shard unverified, a peer excluded, a cancel) and
// made a CI log of a 1,000-shard job thousands of lines long. --json
// still writes every event: programs read those.

const (
	// watchRefresh is how often a terminal's progress line is redrawn in
	// place, and how often the watch looks at the clock at all.
	watchRefresh = time.Second
	// watchWindow is the recent window of the shards/s rate and the ETA
	// (and of a terminal's lease summary): long enough that one batch of
	// reports does not swing the ETA, short enough that a stall shows
	// within seconds.
	watchWindow = 10 * time.Second
	// watchLogEvery and watchLogMax bound the interval between progress
	// lines when the output is not a terminal (a log): every watchLogEvery
	// at first, then a tenth of the time watched so far, at most
	// watchLogMax; an hour-long job still logs tens of lines, not hundreds.
	watchLogEvery = 5 * time.Second
	watchLogMax   = time.Minute
	// watchNotesPerKind is how many important events of one kind are
	// printed one by one per watchLogEvery; the rest are counted on one
	// line. A cancel flags every open shard at once, and a liar is
	// out-voted on every shard it runs.
	watchNotesPerKind = 5
)

// watchJob follows a job's event stream until it completes: every event
// as JSON under --json, else a jobWatch's summary.
func watchJob(ctx context.Context, c *api.Client, id content.Ref, w io.Writer) error {
	if jsonOutput {
		return c.Watch(ctx, id, func(e api.Event) error {
			fmt.Fprintf(w, "{\"event\":%q,\"data\":%s}\n", e.Kind, e.Data)
			return nil
		})
	}
	tty, width := terminal(w)
	s := newJobWatch(w, id, time.Now(), tty, width)
	// Events arrive on the stream's goroutine; the clock ticks on its own,
	// so the line moves (and a stall shows) while no event comes.
	var mu sync.Mutex
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(watchRefresh)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				mu.Lock()
				s.tick(now)
				mu.Unlock()
			}
		}
	}()
	err := c.Watch(ctx, id, func(e api.Event) error {
		mu.Lock()
		defer mu.Unlock()
		s.event(time.Now(), e)
		return nil
	})
	close(stop)
	<-stopped
	s.stop(time.Now())
	return err
}

// jobWatch turns a job's events into a progress line with rates and an
// ETA, a per-interval lease summary, and a line for each event that
// matters. It reads no clock: callers pass the time, so a test drives it
// with a fake one.
type jobWatch struct {
	w     io.Writer
	tty   bool
	width int // the terminal's columns; 0 if unknown
	id    content.Ref
	start time.Time

	seen                        bool // the first status arrived
	total, verified, unverified int
	atStart                     int // shards decided before the watch began

	recent   []watchStamp // decisions and lease events of the last watchWindow
	sinceLog leaseCounts  // lease events since the last logged line
	leases   leaseCounts  // lease events since the watch began
	lastLine time.Time    // when the last progress line was logged
	drawn    int          // columns of a terminal's unterminated progress line (0: none)
	running  bool         // the job has open shards: progress lines are due
	ended    bool         // the final summary is written
	notes    [noteKinds]noteGroup
}

func newJobWatch(w io.Writer, id content.Ref, now time.Time, tty bool, width int) *jobWatch {
	return &jobWatch{w: w, tty: tty, width: width, id: id, start: now, lastLine: now}
}

type stampKind uint8

const (
	stampDecided stampKind = iota
	stampGranted
	stampReleased
	stampExpired
	stampRevoked
)

type watchStamp struct {
	at   time.Time
	kind stampKind
}

// leaseCounts are lease events over an interval.
type leaseCounts struct{ granted, released, expired, revoked int }

func (l *leaseCounts) add(k stampKind) {
	switch k {
	case stampGranted:
		l.granted++
	case stampReleased:
		l.released++
	case stampExpired:
		l.expired++
	case stampRevoked:
		l.revoked++
	}
}

// String is the summary's wording: "120 granted, 3 handed back, 1 lapsed".
func (l leaseCounts) String() string {
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{{l.granted, "granted"}, {l.released, "handed back"}, {l.expired, "lapsed"}, {l.revoked, "revoked (shard decided meanwhile)"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// noteKind groups the events printed one by one, for watchNotesPerKind.
type noteKind int

const (
	noteUnverified noteKind = iota
	noteOutvoted
	noteLateDisagrees
	noteCaught
	noteExcluded
	noteReopened
	noteReversed
	noteReduction
	noteKinds
)

// noteGroup counts one kind's lines in the current period.
type noteGroup struct {
	since  time.Time
	shown  int
	more   int
	what   string // the suppressed ones, plural: "shards unverified"
	detail string // what the suppressed ones share ("" when they differ)
	mixed  bool
}

func (s *jobWatch) decided() int { return s.verified + s.unverified }

// event takes one event of the stream at time now.
func (s *jobWatch) event(now time.Time, e api.Event) {
	if s.ended {
		return
	}
	switch e.Kind {
	case "status":
		var st coordinator.JobStatus
		if json.Unmarshal(e.Data, &st) == nil {
			s.status(now, st)
		}
	case "shard-leased":
		s.stamp(now, stampGranted)
	case "lease-ended":
		var ev coordinator.LeaseEnded
		json.Unmarshal(e.Data, &ev)
		switch ev.Reason {
		case coordinator.LeaseReleased:
			s.stamp(now, stampReleased)
		case coordinator.LeaseExpired:
			s.stamp(now, stampExpired)
		default:
			s.stamp(now, stampRevoked)
		}
	case "shard-verified":
		var ev coordinator.ShardVerified
		json.Unmarshal(e.Data, &ev)
		s.decide(now, &s.verified)
		if len(ev.Losers) > 0 {
			s.note(now, noteOutvoted, fmt.Sprintf("  shard %d verified by %s; out-voted: %s", ev.Shard, strings.Join(ev.Agreeing, ", "), strings.Join(ev.Losers, ", ")),
				"shards with out-voted reports", "out-voted: "+strings.Join(ev.Losers, ", "))
		}
	case "shard-flagged":
		var ev coordinator.ShardFlagged
		json.Unmarshal(e.Data, &ev)
		s.decide(now, &s.unverified)
		s.note(now, noteUnverified, fmt.Sprintf("  shard %d UNVERIFIED after %d reports: %s", ev.Shard, ev.Reports, ev.Reason), "shards unverified", ev.Reason)
	case "shard-reopened":
		var ev coordinator.ShardReopened
		json.Unmarshal(e.Data, &ev)
		if s.verified > 0 {
			s.verified--
		}
		s.running = true // a decided job runs again until the re-check
		s.note(now, noteReopened, fmt.Sprintf("  shard %d reopened for a re-check: %s, who vouched for it, was caught", ev.Shard, ev.Suspect),
			"shards reopened", "suspect "+ev.Suspect)
	case "result-reported":
		var ev coordinator.ResultReported
		json.Unmarshal(e.Data, &ev)
		if ev.Outcome == coordinator.OutcomeExtraDisagrees {
			s.note(now, noteLateDisagrees, fmt.Sprintf("  shard %d: a late report by %s disagrees with the verified result", ev.Shard, ev.Peer),
				"late reports that disagree", "by "+ev.Peer)
		}
	case "peer-caught":
		var ev coordinator.PeerCaught
		json.Unmarshal(e.Data, &ev)
		what := "its result differed from the verified one"
		if ev.Stamp {
			what = "it approved a result found wrong"
		}
		if ev.Excluded {
			s.note(now, noteExcluded, fmt.Sprintf("  peer %s EXCLUDED from the pool after %d offences (shard %d: %s)", ev.Peer, ev.Offences, ev.Shard, what), "peers excluded", "")
		} else {
			s.note(now, noteCaught, fmt.Sprintf("  peer %s caught on shard %d: %s (offence %d)", ev.Peer, ev.Shard, what, ev.Offences), "peers caught", ev.Peer)
		}
	case "receipt-reversed":
		var ev coordinator.ReceiptReversed
		json.Unmarshal(e.Data, &ev)
		s.note(now, noteReversed, fmt.Sprintf("  shard %d: receipt %d reversed by receipt %d (its result was found wrong)", ev.Shard, ev.Receipt, ev.Reversal), "receipts reversed", "")
	case "reduction-checked":
		var ev coordinator.ReductionChecked
		json.Unmarshal(e.Data, &ev)
		if ev.Agrees {
			s.note(now, noteReduction, fmt.Sprintf("  reduction confirmed by %s", ev.Peer), "reduction checks", "")
		} else {
			s.note(now, noteReduction, fmt.Sprintf("  reduction DISPUTED by %s (its reduction: %s)", ev.Peer, ev.Reduced.Short()), "reduction checks", "")
		}
	case "job-decided":
		var ev coordinator.AllShardsDecided
		json.Unmarshal(e.Data, &ev)
		// The pool's count: it holds even if the stream missed an event.
		s.verified, s.unverified, s.running = ev.Verified, ev.Unverified, false
		s.flushNotes(now, true)
		s.println(fmt.Sprintf("all shards decided: %d verified, %d unverified; reducing", ev.Verified, ev.Unverified))
	case "job-cancelled":
		var ev coordinator.JobCancelled
		json.Unmarshal(e.Data, &ev)
		s.flushNotes(now, true)
		s.println(fmt.Sprintf("job cancelled by %s%s", ev.Peer, reasonSuffix(ev.Reason)))
		s.end(now, "cancelled", 0)
	case "job-complete":
		var ev coordinator.JobComplete
		json.Unmarshal(e.Data, &ev)
		s.flushNotes(now, true)
		s.println(fmt.Sprintf("job complete: result %s (reduced by %s)", ev.Reduced.Short(), ev.Reducer))
		s.end(now, "done", 0)
	}
}

// status takes the stream's first event, or the first after a reconnect:
// the pool's counts replace the watch's, which may have missed events
// while the stream was down.
func (s *jobWatch) status(now time.Time, st coordinator.JobStatus) {
	first := !s.seen
	s.seen = true
	s.total, s.verified, s.unverified = st.Counts.Total, st.Counts.Verified, st.Counts.Unverified
	if first {
		s.atStart = s.decided()
		s.println(fmt.Sprintf("job %s (%s): %s; %d/%d verified, %d flagged, %d leased",
			st.Name, s.id.Short(), st.State, st.Counts.Verified, st.Counts.Total, st.Counts.Unverified, st.Counts.Leased))
	}
	switch st.State {
	case coordinator.JobRunning:
		s.running = true
	case coordinator.JobDone, coordinator.JobCancelledState, coordinator.JobAbandoned:
		// The stream ends here: the job ended before the watch began, or
		// while it reconnected.
		s.running = false
		s.flushNotes(now, true)
		if st.Reduced != "" {
			s.println(fmt.Sprintf("job complete: result %s (reduced by %s)", st.Reduced.Short(), st.Reducer))
		}
		var poolWall time.Duration
		if first && st.DoneAt > st.SubmittedAt {
			poolWall = time.Duration(st.DoneAt-st.SubmittedAt) * time.Millisecond
		}
		s.end(now, string(st.State), poolWall)
	default:
		s.running = false // decided: waiting for its reducer
	}
}

// decide counts a shard decided at now in *n (verified or unverified),
// unless the count would pass the total: the event was already in the
// status the stream began with (it subscribes before it reads the status).
func (s *jobWatch) decide(now time.Time, n *int) {
	if s.total > 0 && s.decided()+1 > s.total {
		return
	}
	*n++
	s.stamp(now, stampDecided)
}

func (s *jobWatch) stamp(now time.Time, k stampKind) {
	s.recent = append(s.recent, watchStamp{now, k})
	s.sinceLog.add(k)
	s.leases.add(k)
}

// trim drops the stamps older than watchWindow.
func (s *jobWatch) trim(now time.Time) {
	i := 0
	for i < len(s.recent) && !s.recent[i].at.After(now.Add(-watchWindow)) {
		i++
	}
	s.recent = append(s.recent[:0], s.recent[i:]...)
}

// tick is called every watchRefresh: a terminal's line is redrawn, a log
// gets a line when its interval has passed.
func (s *jobWatch) tick(now time.Time) {
	if s.ended {
		return
	}
	s.flushNotes(now, false)
	if !s.running {
		return
	}
	s.trim(now)
	if s.tty {
		var leases leaseCounts
		for _, st := range s.recent {
			leases.add(st.kind)
		}
		line := s.progress(now, leases, min(watchWindow, now.Sub(s.start)))
		cols := len([]rune(line))
		if s.width > 1 && cols > s.width-1 {
			// A wrapped line cannot be rewritten with \r.
			line, cols = string([]rune(line)[:s.width-1]), s.width-1
		}
		// Spaces, not an ANSI erase, cover a longer line before: a dumb
		// terminal (TERM=dumb, an editor's shell) shows escapes as text.
		fmt.Fprintf(s.w, "\r%s%s", line, strings.Repeat(" ", max(s.drawn-cols, 0)))
		s.drawn = cols
		return
	}
	// Half a tick of slack: the ticker's jitter would otherwise put every
	// other line a whole tick late (10.001 s after one at 5.002 s).
	if now.Sub(s.lastLine) < s.logInterval(now)-watchRefresh/2 {
		return
	}
	s.println(s.progress(now, s.sinceLog, now.Sub(s.lastLine)))
	s.sinceLog, s.lastLine = leaseCounts{}, now
}

// logInterval is the time between two progress lines in a log.
func (s *jobWatch) logInterval(now time.Time) time.Duration {
	return min(max(now.Sub(s.start)/10, watchLogEvery), watchLogMax)
}

// progress is the line: elapsed time, counts, recent and overall rate,
// ETA, and the lease events of the last span.
func (s *jobWatch) progress(now time.Time, leases leaseCounts, span time.Duration) string {
	elapsed := now.Sub(s.start)
	window := min(watchWindow, elapsed)
	var recent, overall float64
	for _, st := range s.recent {
		if st.kind == stampDecided {
			recent++
		}
	}
	if window > 0 {
		recent /= window.Seconds()
	}
	if elapsed > 0 {
		overall = float64(s.decided()-s.atStart) / elapsed.Seconds()
	}
	eta := "?" // nothing decided in the window: no honest estimate
	switch left := s.total - s.decided(); {
	case left <= 0:
		eta = "0s"
	case recent > 0:
		d := time.Duration(float64(left) / recent * float64(time.Second))
		eta = fmtWatchDur(d)
		if d < time.Second {
			eta = "<1s" // "0s" with shards left would read as done
		}
	}
	return fmt.Sprintf("  [%s] %d/%d decided (%d verified, %d unverified); %s shards/s (last %s), %s overall; ETA %s; leases: %s in the last %s",
		fmtWatchDur(elapsed), s.decided(), s.total, s.verified, s.unverified,
		fmtRate(recent), fmtWatchDur(window), fmtRate(overall), eta, leases, fmtWatchDur(span))
}

// note prints an important event, or counts it when its kind has had
// watchNotesPerKind lines in this period.
func (s *jobWatch) note(now time.Time, k noteKind, line, what, detail string) {
	g := &s.notes[k]
	if g.since.IsZero() || now.Sub(g.since) >= watchLogEvery {
		s.flushNote(g)
		g.since, g.shown = now, 0
	}
	if g.shown < watchNotesPerKind {
		g.shown++
		s.println(line)
		return
	}
	if g.more == 0 {
		g.detail, g.mixed = detail, false
	} else if detail != g.detail {
		g.mixed = true
	}
	g.more++
	g.what = what
}

// flushNotes writes the counts of the kinds whose period is over (all of
// them if all): before the job's last lines, so nothing counted is lost.
func (s *jobWatch) flushNotes(now time.Time, all bool) {
	for k := range s.notes {
		g := &s.notes[k]
		if all || (!g.since.IsZero() && now.Sub(g.since) >= watchLogEvery) {
			s.flushNote(g)
		}
	}
}

func (s *jobWatch) flushNote(g *noteGroup) {
	if g.more == 0 {
		return
	}
	detail := ""
	if !g.mixed && g.detail != "" {
		detail = " (" + g.detail + ")"
	}
	s.println(fmt.Sprintf("  … and %d more %s%s", g.more, g.what, detail))
	g.more = 0
}

// println writes a line that stays: over a terminal's progress line, which
// the next tick draws again below it.
func (s *jobWatch) println(line string) {
	if s.drawn > 0 {
		fmt.Fprintf(s.w, "\r%s\r", strings.Repeat(" ", s.drawn))
		s.drawn = 0
	}
	fmt.Fprintln(s.w, line)
}

// end writes the final summary: total wall time, mean shards/s, and the
// leases seen (a job shorter than a log's interval has no other). state
// is how the job ended; poolWall, when known, is the job's own wall time
// by the pool's clock (a job that ended before the watch began).
func (s *jobWatch) end(now time.Time, state string, poolWall time.Duration) {
	if s.ended {
		return
	}
	s.ended, s.running = true, false
	wall, n, how := now.Sub(s.start), s.decided()-s.atStart, ""
	switch {
	case poolWall > 0:
		wall, n, how = poolWall, s.decided(), " by the pool's clock"
	case s.atStart > 0:
		// The rate is of the shards decided while watching.
		how = fmt.Sprintf(" (the watch began with %d shards decided)", s.atStart)
	}
	verb := state + " after"
	if state == "done" {
		verb = "done in"
	}
	line := fmt.Sprintf("%s %s%s: %d/%d shards decided (%d verified, %d unverified)", verb, fmtWall(wall), how, s.decided(), s.total, s.verified, s.unverified)
	// A cancelled or abandoned job's open shards were flagged at once,
	// not run: a rate would count them.
	if state != string(coordinator.JobCancelledState) && state != string(coordinator.JobAbandoned) {
		rate := 0.0
		if wall > 0 {
			rate = float64(n) / wall.Seconds()
		}
		line += fmt.Sprintf(", %s shards/s mean", fmtRate(rate))
	}
	if s.leases != (leaseCounts{}) {
		line += "; leases: " + s.leases.String()
	}
	s.println(line)
}

// stop ends the watch when the stream ended without saying how the job
// ended (an interrupt, an error): the summary so far, so a terminal is
// not left on an unterminated line.
func (s *jobWatch) stop(now time.Time) {
	if s.ended || !s.seen {
		return // nothing drawn, or the summary is written
	}
	s.flushNotes(now, true)
	s.end(now, "stopped watching", 0)
}

// fmtWatchDur is a duration to the second: "7s", "3m05s", "1h02m".
func fmtWatchDur(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
}

// fmtWall is a wall time to a tenth of a second.
func fmtWall(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

// fmtRate keeps two or three significant digits: 0.25, 4.3, 2140.
func fmtRate(r float64) string {
	switch {
	case r < 1:
		return fmt.Sprintf("%.2f", r)
	case r < 100:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.0f", r)
}
