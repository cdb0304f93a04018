package coordinator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

func applyEncoded(t *testing.T, m *Machine, c Command) Result {
	t.Helper()
	b, err := EncodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	return m.Apply(back)
}

func roundJob(run content.Ref, round int, silos ...string) SubmitJob {
	c := SubmitJob{
		Job: content.Hash([]byte(fmt.Sprintf("%s/round/%d", run, round))), Name: fmt.Sprintf("round-%d", round),
		Bundle: content.Hash([]byte("bundle")), Run: run, Round: round, Policy: Policy{Replicas: 1}, Now: int64(100 + round),
	}
	for i, s := range silos {
		c.Shards = append(c.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprintf("%d/%d", round, i))), Price: 1, PriceBasis: "training step", Peer: s})
	}
	return c
}

func wantCode(t *testing.T, r Result, code diag.Code) {
	t.Helper()
	if !r.Refused() || r.Refusal[0].Code != code {
		t.Fatalf("want refusal %s, got %+v", code, r)
	}
}

func TestTrainingRunRounds(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium})
	run := content.Hash([]byte("run spec"))
	start := StartRun{Run: run, Name: "fedprox", Rounds: 2, Silos: []string{"s3", "s1", "s2"}, DP: true, SecureAgg: true,
		Dataset: trust.Item{Name: "icu", Class: trust.Confidential}, Now: 1}

	// Admission: a consortium refuses training without DP or secure aggregation.
	noDP := start
	noDP.DP = false
	wantCode(t, applyEncoded(t, m, noDP), diag.ConsortiumNoDP)
	two := start
	two.Silos = []string{"s1", "s2"}
	wantCode(t, applyEncoded(t, m, two), diag.RunTooFewSites)

	if r := applyEncoded(t, m, start); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if r := applyEncoded(t, m, start); r.Refused() || !r.Response.(*StartRunResponse).Existing {
		t.Fatalf("restart not idempotent: %+v", r)
	}
	// The run's start time is its command's (it was once zeroed with the
	// plan's copy of the command, and every run said it started at 0).
	if st, err := m.Run(run); err != nil || st.StartedAt != start.Now {
		t.Fatalf("the run started at %d, its command at %d (%v)", st.StartedAt, start.Now, err)
	}

	// Rounds are planned in order, one per cohort silo, one replica.
	wantCode(t, applyEncoded(t, m, roundJob(run, 1, "s1", "s2", "s3")), diag.RunBadRound)
	wantCode(t, applyEncoded(t, m, roundJob(run, 0, "s1", "s2")), diag.RunTooFewSites)
	wantCode(t, applyEncoded(t, m, roundJob(run, 0, "s1", "s2", "mallory")), diag.RunBadRound)
	r0 := roundJob(run, 0, "s1", "s2", "s3")
	if r := applyEncoded(t, m, r0); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if r := applyEncoded(t, m, r0); r.Refused() || !r.Response.(*SubmitResponse).Existing {
		t.Fatalf("resubmitting the round is not idempotent: %+v", r)
	}
	other := roundJob(run, 0, "s1", "s2", "s3")
	other.Job = content.Hash([]byte("a second job for round 0"))
	wantCode(t, applyEncoded(t, m, other), diag.RunBadRound)

	// Only a shard's silo may lease it.
	if g := applyEncoded(t, m, Lease{Peer: "w1", Now: 110, Max: 3}).Response.(*LeaseResponse).Grants; len(g) != 0 {
		t.Fatalf("a worker leased a silo's shard: %+v", g)
	}
	for i, s := range []string{"s1", "s2", "s3"} {
		resp := applyEncoded(t, m, Lease{Peer: s, Now: 111, Max: 3}).Response.(*LeaseResponse)
		g := resp.Grants
		if len(g) != 1 || g[0].Shard != i {
			t.Fatalf("%s got %+v", s, g)
		}
		// The silo learns its round from the lease, not from a status read.
		if len(resp.Jobs) != 1 || resp.Jobs[0].Run != run || resp.Jobs[0].Round != 0 || resp.Jobs[0].Bundle != r0.Bundle {
			t.Fatalf("%s: the lease describes %+v, want run %s round 0", s, resp.Jobs, run.Short())
		}
		if r := applyEncoded(t, m, ReportResult{Peer: s, Job: r0.Job, Shard: i, Result: content.Hash([]byte(s)), Now: 112}); r.Refused() {
			t.Fatal(r.Refusal)
		}
	}
	model0 := content.Hash([]byte("model after round 0"))
	res := applyEncoded(t, m, ReportReduced{Job: r0.Job, Peer: "agg-1", Reduced: model0, Now: 113})
	if res.Refused() {
		t.Fatal(res.Refusal)
	}
	st, _ := m.Run(run)
	if len(st.Models) != 1 || st.Models[0] != model0 || st.State != RunRunning {
		t.Fatalf("after round 0: %+v", st)
	}
	r1 := roundJob(run, 1, "s1", "s2", "s3")
	applyEncoded(t, m, r1)
	for i, s := range []string{"s1", "s2", "s3"} {
		applyEncoded(t, m, Lease{Peer: s, Now: 120, Max: 1})
		applyEncoded(t, m, ReportResult{Peer: s, Job: r1.Job, Shard: i, Result: content.Hash([]byte(s + "1")), Now: 121})
	}
	res = applyEncoded(t, m, ReportReduced{Job: r1.Job, Peer: "agg-1", Reduced: content.Hash([]byte("final")), Now: 122})
	var complete bool
	for _, e := range res.Events {
		if rc, ok := e.(RunComplete); ok && rc.State == RunDone {
			complete = true
		}
	}
	if st, _ := m.Run(run); !complete || st.State != RunDone || len(st.Jobs) != 2 {
		t.Fatalf("run not complete: %+v", st)
	}
	wantCode(t, applyEncoded(t, m, roundJob(run, 2, "s1", "s2", "s3")), diag.RunNotRunning)

	// The whole state survives a snapshot.
	m2, _ := New(Config{Regime: trust.Consortium})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}

func TestStopRun(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	run := content.Hash([]byte("r"))
	applyEncoded(t, m, StartRun{Run: run, Name: "r", Rounds: 5, Silos: []string{"a", "b", "c"}, Now: 1})
	r := applyEncoded(t, m, StopRun{Run: run, Reason: "silo b's budget is spent; two silos remain", Now: 2})
	if r.Refused() || r.Response.(*StopRunResponse).State != RunStopped {
		t.Fatalf("%+v", r)
	}
	wantCode(t, applyEncoded(t, m, StopRun{Run: content.Hash([]byte("nope")), Now: 3}), diag.RunUnknown)
}

func TestFlagDroppedRound(t *testing.T) {
	m, _ := New(Config{Regime: trust.Own})
	run := content.Hash([]byte("run"))
	applyEncoded(t, m, StartRun{Run: run, Name: "r", Rounds: 2, Silos: []string{"a", "b", "c", "d"}, Now: 1})
	r0 := roundJob(run, 0, "a", "b", "c", "d")
	if r := applyEncoded(t, m, r0); r.Refused() {
		t.Fatal(r.Refusal)
	}
	// a, b and c take part and report; d leased and dropped out.
	for i, s := range []string{"a", "b", "c", "d"} {
		applyEncoded(t, m, Lease{Peer: s, Now: 110, Max: 1})
		if s != "d" {
			applyEncoded(t, m, ReportResult{Peer: s, Job: r0.Job, Shard: i, Result: content.Hash([]byte(s)), Now: 111})
		}
	}
	// Not reducible yet; a plain job cannot be flagged this way.
	wantCode(t, applyEncoded(t, m, ReportReduced{Job: r0.Job, Peer: "agg", Reduced: content.Hash([]byte("m")), Now: 112}), diag.PoolJobNotDecided)
	plain := roundJob(run, 0, "a", "b", "c")
	plain.Job, plain.Run, plain.Round, plain.Name = content.Hash([]byte("plain")), "", 0, "plain"
	for i := range plain.Shards {
		plain.Shards[i].Peer = ""
	}
	if r := applyEncoded(t, m, plain); r.Refused() {
		t.Fatal(r.Refusal)
	}
	wantCode(t, applyEncoded(t, m, FlagDropped{Job: plain.Job, Now: 112}), diag.RunBadRound)
	wantCode(t, applyEncoded(t, m, FlagDropped{Job: content.Hash([]byte("nope")), Now: 112}), diag.PoolUnknownJob)

	res := applyEncoded(t, m, FlagDropped{Job: r0.Job, Reason: "secure aggregation summed 3 of 4", Now: 113})
	if res.Refused() {
		t.Fatal(res.Refusal)
	}
	resp := res.Response.(*FlagDroppedResponse)
	if len(resp.Flagged) != 1 || resp.Flagged[0] != 3 || resp.State != JobDecided {
		t.Fatalf("flagged %+v", resp)
	}
	var flagged, revoked, decided bool
	for _, e := range res.Events {
		switch e := e.(type) {
		case ShardFlagged:
			flagged = e.Shard == 3 && e.Reason == DroppedReason+": secure aggregation summed 3 of 4"
		case LeaseEnded:
			revoked = e.Peer == "d" && e.Reason == LeaseRevoked
		case AllShardsDecided:
			decided = e.Verified == 3 && e.Unverified == 1
		}
	}
	if !flagged || !revoked || !decided {
		t.Fatalf("events %+v", res.Events)
	}
	// Again: nothing more to flag.
	if r := applyEncoded(t, m, FlagDropped{Job: r0.Job, Now: 114}); r.Refused() || len(r.Response.(*FlagDroppedResponse).Flagged) != 0 {
		t.Fatalf("%+v", r)
	}
	// A late report from the dropped silo changes nothing.
	if r := applyEncoded(t, m, ReportResult{Peer: "d", Job: r0.Job, Shard: 3, Result: content.Hash([]byte("d")), Now: 115}); r.Refused() ||
		r.Response.(*ReportResponse).Outcome != OutcomeExtraUnverified {
		t.Fatalf("late report: %+v", r)
	}
	if r := applyEncoded(t, m, ReportReduced{Job: r0.Job, Peer: "agg", Reduced: content.Hash([]byte("m")), Now: 116}); r.Refused() {
		t.Fatal(r.Refusal)
	}
	if st, _ := m.Run(run); len(st.Models) != 1 {
		t.Fatalf("%+v", st)
	}
	// Replicas agree after a snapshot.
	m2, _ := New(Config{Regime: trust.Own})
	if err := m2.Restore(m.Snapshot()); err != nil || m2.StateHash() != m.StateHash() {
		t.Fatalf("restore: %v", err)
	}
}
