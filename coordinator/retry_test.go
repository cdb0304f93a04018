package coordinator

import (
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// A round attempt whose host is lost is abandoned and the round planned
// again as a new job, without counting as a failure; failed attempts count,
// pause the run at MaxAttempts, and ResumeRun continues it from its last
// completed round.
func TestRetryPauseResume(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	run := content.Hash([]byte("run"))
	applyEncoded(t, m, StartRun{Run: run, Name: "r", Rounds: 2, Silos: []string{"a", "b", "c"}, Submitter: "alice", Now: 1})
	r0 := roundJob(run, 0, "a", "b", "c")
	if r := applyEncoded(t, m, r0); r.Refused() {
		t.Fatal(r.Refusal)
	}
	applyEncoded(t, m, Lease{Peer: "a", Now: 110, Max: 1})
	applyEncoded(t, m, ReportResult{Peer: "a", Job: r0.Job, Shard: 0, Result: content.Hash([]byte("a")), Now: 111})

	// A stale retry (wrong round) changes nothing.
	wantCode(t, applyEncoded(t, m, RetryRound{Run: run, Round: 1, Job: r0.Job, Now: 112}), diag.RunBadRound)
	// The leader that opened round 0 is gone: the new one abandons it.
	res := applyEncoded(t, m, RetryRound{Run: run, Round: 0, Job: r0.Job, Reason: "host lost", MaxAttempts: 2, RetryAt: 150, Now: 112})
	if res.Refused() || res.Response.(*RetryRoundResponse).Failures != 0 {
		t.Fatalf("%+v", res)
	}
	if js, _ := m.Job(r0.Job); js.State != JobAbandoned {
		t.Fatalf("job state %s", js.State)
	}
	if st, _ := m.Run(run); st.RetryAt != 150 || st.State != RunRunning {
		t.Fatalf("%+v", st)
	}
	wantCode(t, applyEncoded(t, m, ReportReduced{Job: r0.Job, Peer: "agg", Reduced: content.Hash([]byte("m")), Now: 113}), diag.RunBadRound)
	if g := applyEncoded(t, m, Lease{Peer: "b", Now: 114, Max: 1}).Response.(*LeaseResponse).Grants; len(g) != 0 {
		t.Fatalf("an abandoned round's shard was leased: %+v", g)
	}

	// The round is planned again as a second job.
	again := roundJob(run, 0, "a", "b", "c")
	again.Job = content.Hash([]byte("attempt 2"))
	if r := applyEncoded(t, m, again); r.Refused() {
		t.Fatal(r.Refusal)
	}
	// Failed attempts: the second pauses the run (MaxAttempts 2).
	applyEncoded(t, m, RetryRound{Run: run, Round: 0, Job: again.Job, Reason: "2 survivors", Failed: true, MaxAttempts: 2, Now: 120})
	res = applyEncoded(t, m, RetryRound{Run: run, Round: 0, Reason: "only 2 silos alive", Failed: true, MaxAttempts: 2, Now: 121})
	st, _ := m.Run(run)
	if st.State != RunPaused || st.Failures != 2 {
		t.Fatalf("%+v", st)
	}
	var paused bool
	for _, e := range res.Events {
		if rc, ok := e.(RunComplete); ok && rc.State == RunPaused {
			paused = true
		}
	}
	if !paused {
		t.Fatalf("no run-complete (paused) event: %+v", res.Events)
	}
	third := roundJob(run, 0, "a", "b", "c")
	third.Job = content.Hash([]byte("attempt 3"))
	wantCode(t, applyEncoded(t, m, third), diag.RunNotRunning)

	// Resume: running again, failures forgotten; the round goes on.
	wantCode(t, applyEncoded(t, m, ResumeRun{Run: run, Peer: "mallory", Now: 130}), diag.PoolForbidden)
	if st, _ := m.Run(run); st.State != RunPaused {
		t.Fatalf("%+v", st)
	}
	if r := applyEncoded(t, m, ResumeRun{Run: run, Peer: "alice", Now: 130}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	wantCode(t, applyEncoded(t, m, ResumeRun{Run: run, Peer: "alice", Now: 131}), diag.RunNotResumable)
	wantCode(t, applyEncoded(t, m, ResumeRun{Run: content.Hash([]byte("nope")), Peer: "alice", Now: 131}), diag.RunUnknown)
	if st, _ := m.Run(run); st.State != RunRunning || st.Failures != 0 || st.Submitter != "alice" {
		t.Fatalf("%+v", st)
	}
	if r := applyEncoded(t, m, third); r.Refused() {
		t.Fatal(r.Refusal)
	}
	// A paused run can be cancelled (StopRun) by its submitter or an
	// operator only; a stopped one is not resumed.
	applyEncoded(t, m, RetryRound{Run: run, Round: 0, Job: third.Job, Failed: true, MaxAttempts: 1, Now: 140})
	wantCode(t, applyEncoded(t, m, StopRun{Run: run, Peer: "mallory", Now: 140}), diag.PoolForbidden)
	if r := applyEncoded(t, m, StopRun{Run: run, Reason: "cancelled", Peer: "alice", Now: 141}); r.Refused() || r.Response.(*StopRunResponse).State != RunStopped {
		t.Fatalf("%+v", r)
	}
	wantCode(t, applyEncoded(t, m, ResumeRun{Run: run, Peer: "alice", Now: 142}), diag.RunNotResumable)

	m2, _ := New(Config{Regime: trust.Own})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}

// A pause whose last failure heals by itself is resumed by the leader
// (ResumeRun.Auto) no sooner than its RetryAt; each automatic resume of
// the same round is counted (the leader doubles its backoff by it) until
// the round completes; a pause that cannot heal is refused an automatic
// resume and waits for a person, whose resume starts the count afresh.
func TestAutoResume(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	run := content.Hash([]byte("run"))
	applyEncoded(t, m, StartRun{Run: run, Name: "r", Rounds: 2, Silos: []string{"a", "b", "c"}, Submitter: "alice", Now: 1})
	pause := func(now int64, heals bool) {
		t.Helper()
		res := applyEncoded(t, m, RetryRound{Run: run, Round: 0, Reason: "1 of 3 silos alive", Failed: true, Heals: heals, MaxAttempts: 1, RetryAt: now + 50, Now: now})
		if res.Refused() || res.Response.(*RetryRoundResponse).State != RunPaused {
			t.Fatalf("%+v", res)
		}
		if st, _ := m.Run(run); st.Heals != heals || st.RetryAt != now+50 {
			t.Fatalf("paused run %+v", st)
		}
	}
	auto := ResumeRun{Run: run, Peer: "agg-1", Auto: true}

	// Not before RetryAt; then running, with the resume counted.
	pause(100, true)
	auto.Now = 149
	wantCode(t, applyEncoded(t, m, auto), diag.RunNotResumable)
	if st, _ := m.Run(run); st.State != RunPaused {
		t.Fatalf("resumed before its time: %+v", st)
	}
	auto.Now = 150
	res := applyEncoded(t, m, auto)
	if res.Refused() {
		t.Fatal(res.Refusal)
	}
	if rr, ok := res.Events[len(res.Events)-1].(RunResumed); !ok || !rr.Auto || rr.Peer != "agg-1" {
		t.Fatalf("events %+v", res.Events)
	}
	if st, _ := m.Run(run); st.State != RunRunning || st.Resumes != 1 || st.Heals || st.Failures != 0 || st.RetryAt != 0 {
		t.Fatalf("auto-resumed run %+v", st)
	}
	// A stale proposal (the run runs) changes nothing.
	auto.Now = 151
	wantCode(t, applyEncoded(t, m, auto), diag.RunNotResumable)

	// Paused again, healing: the count goes on.
	pause(200, true)
	auto.Now = 250
	if r := applyEncoded(t, m, auto); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if st, _ := m.Run(run); st.Resumes != 2 {
		t.Fatalf("%+v", st)
	}

	// A pause that cannot heal is never resumed by the leader; a person's
	// resume is, and starts the count afresh.
	pause(300, false)
	auto.Now = 1000
	wantCode(t, applyEncoded(t, m, auto), diag.RunNotResumable)
	if st, _ := m.Run(run); st.State != RunPaused || st.Reason == "" {
		t.Fatalf("a pause that cannot heal: %+v", st)
	}
	if r := applyEncoded(t, m, ResumeRun{Run: run, Peer: "alice", Now: 1001}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if st, _ := m.Run(run); st.State != RunRunning || st.Resumes != 0 {
		t.Fatalf("%+v", st)
	}

	// A completed round forgets the resumes of the round before.
	pause(1100, true)
	auto.Now = 1150
	applyEncoded(t, m, auto)
	r0 := roundJob(run, 0, "a", "b", "c")
	r0.Now = 1160
	if r := applyEncoded(t, m, r0); r.Refused() {
		t.Fatal(r.Refusal)
	}
	for i, s := range []string{"a", "b", "c"} {
		applyEncoded(t, m, Lease{Peer: s, Now: 1161, Max: 1})
		applyEncoded(t, m, ReportResult{Peer: s, Job: r0.Job, Shard: i, Result: content.Hash([]byte(s)), Now: 1162})
	}
	if r := applyEncoded(t, m, ReportReduced{Job: r0.Job, Peer: "agg-1", Reduced: content.Hash([]byte("m0")), Now: 1163}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if st, _ := m.Run(run); len(st.Models) != 1 || st.Resumes != 0 {
		t.Fatalf("after round 0: %+v", st)
	}
	// A stopped run is never resumed by the leader.
	applyEncoded(t, m, RetryRound{Run: run, Round: 1, Failed: true, Heals: true, MaxAttempts: 1, RetryAt: 1200, Now: 1170})
	applyEncoded(t, m, StopRun{Run: run, Reason: "cancelled", Peer: "alice", Now: 1171})
	auto.Now = 2000
	wantCode(t, applyEncoded(t, m, auto), diag.RunNotResumable)

	m2, _ := New(Config{Regime: trust.Own})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}
