package coordinator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/trust"
)

// sweepJob is a generic job of n shards submitted at now.
func sweepJob(name string, n int, now int64) SubmitJob {
	c := SubmitJob{Job: content.Hash([]byte(name)), Name: name, Bundle: content.Hash([]byte("bundle " + name)), Submitter: "alice", Now: now}
	for i := 0; i < n; i++ {
		c.Shards = append(c.Shards, ShardPlan{Index: i, ID: content.Hash([]byte(fmt.Sprintf("%s/%d", name, i))), Price: 1, PriceBasis: "flat"})
	}
	return c
}

// A silo that serves a training run while a sweep submitted earlier runs:
// its round's shard comes first whatever it asks for, a lease of rounds
// alone never holds generic work (nor is it woken for it), a lease of
// generic work never holds a round, and no request of one kind is
// answered from the other's memo.
func TestLeaseKinds(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium})
	mustApply := func(c Command) Result {
		t.Helper()
		r := applyEncoded(t, m, c)
		if r.Refused() {
			t.Fatal(r.Refusal)
		}
		return r
	}
	granted := func(c Lease) []LeaseGrant {
		t.Helper()
		return mustApply(c).Response.(*LeaseResponse).Grants
	}
	sweep := sweepJob("sweep", 40, 1)
	mustApply(sweep)
	run := content.Hash([]byte("run"))
	mustApply(StartRun{Run: run, Name: "fedavg", Rounds: 2, Silos: []string{"s1", "s2", "s3"}, DP: true, SecureAgg: true,
		Dataset: trust.Item{Name: "icu", Class: trust.Confidential}, Now: 2})
	round := roundJob(run, 0, "s1", "s2", "s3")
	mustApply(round)

	// An old client (no kinds) gets its round first, then generic work.
	g := granted(Lease{Peer: "s1", Now: 3, Max: 3})
	if len(g) != 3 || g[0].Job != round.Job || g[1].Job != sweep.Job {
		t.Fatalf("a lease of every kind: %+v, want the round's shard then the sweep's", g)
	}
	// Rounds alone: the round's shard, nothing else, and nothing more.
	rounds := Kinds{KindRound}
	if n := m.LeasableKinds("s2", rounds, 4); n != 1 {
		t.Fatalf("s2 may lease %d round shards, want 1", n)
	}
	if g := granted(Lease{Peer: "s2", Now: 4, Max: 4, Kinds: rounds}); len(g) != 1 || g[0].Job != round.Job || g[0].Shard != 1 {
		t.Fatalf("a lease of rounds alone: %+v", g)
	}
	if n := m.LeasableKinds("s2", rounds, 5); n != 0 {
		t.Fatalf("s2 holds its round; %d more round shards leasable (the sweep's count for rounds alone)", n)
	}
	if g := granted(Lease{Peer: "s2", Now: 5, Max: 4, Kinds: rounds}); len(g) != 0 {
		t.Fatalf("a lease of rounds alone with only generic work left: %+v", g)
	}
	// Generic alone: the sweep's shards, never the round's.
	generic := Kinds{KindGeneric}
	g = granted(Lease{Peer: "s3", Now: 6, Max: 2, Kinds: generic, RequestID: "same"})
	if len(g) != 2 || g[0].Job != sweep.Job || g[1].Job != sweep.Job {
		t.Fatalf("a lease of generic work: %+v", g)
	}
	// The same request ID for rounds is another request (another lane),
	// not a retry of the generic one; a retry of either is answered again.
	r := granted(Lease{Peer: "s3", Now: 7, Max: 2, Kinds: rounds, RequestID: "same"})
	if len(r) != 1 || r[0].Job != round.Job {
		t.Fatalf("s3's round lease with the generic lease's request ID: %+v", r)
	}
	if again := granted(Lease{Peer: "s3", Now: 8, Max: 2, Kinds: generic, RequestID: "same"}); len(again) != 2 || again[0] != g[0] || again[1] != g[1] {
		t.Fatalf("the retried generic lease: %+v, first answer %+v", again, g)
	}
	if again := granted(Lease{Peer: "s3", Now: 8, Max: 2, Kinds: rounds, RequestID: "same"}); len(again) != 1 || again[0] != r[0] {
		t.Fatalf("the retried round lease: %+v, first answer %+v", again, r)
	}

	// Bad kinds are refused.
	for _, k := range []Kinds{{"gpu"}, {KindRound, KindRound}} {
		if r := applyEncoded(t, m, Lease{Peer: "s1", Now: 9, Kinds: k}); !r.Refused() {
			t.Fatalf("kinds %v were not refused: %+v", k, r)
		}
	}

	// The peers' records: s2 asked for rounds alone last, s3 for rounds
	// too; a hand-back is counted.
	mustApply(ReleaseLeases{Peer: "s3", Now: 10, Shards: []ShardRef{{Job: sweep.Job, Shard: g[0].Shard}}})
	recs := map[string]PeerRecord{}
	for _, p := range m.Peers() {
		recs[p.Peer] = p
	}
	if !recs["s2"].RoundsOnly || recs["s1"].RoundsOnly || recs["s3"].Released != 1 || recs["s1"].Released != 0 {
		t.Fatalf("peer records: %+v", recs)
	}
}

// A peer that asks for training rounds alone is never drawn to audit a
// generic shard: it would never lease it, and the audit would wait a
// lease TTL for nothing.
func TestRoundsOnlyPeerIsNoAuditor(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium})
	m.Apply(Lease{Peer: "silo", Now: 1, Kinds: Kinds{KindRound}})
	m.Apply(Lease{Peer: "w1", Now: 1})
	m.Apply(Lease{Peer: "w2", Now: 1, Kinds: Kinds{KindGeneric, KindRound}})
	got := m.auditorCandidates(&shardState{})
	if fmt.Sprint(got) != "[w1 w2]" {
		t.Fatalf("auditor candidates %v, want [w1 w2]", got)
	}
}

// Bulk: a sweep's leases, commitments, reports, renewals and releases
// (alone or all of a batch) are bulk; a training round's, a lease that
// may grant a round, a mixed batch and every other command are not.
func TestBulkCommands(t *testing.T) {
	m, _ := New(Config{Regime: trust.Consortium})
	sweep := sweepJob("sweep", 4, 1)
	applyEncoded(t, m, sweep)
	run := content.Hash([]byte("run"))
	applyEncoded(t, m, StartRun{Run: run, Name: "fedavg", Rounds: 2, Silos: []string{"s1", "s2", "s3"}, DP: true, SecureAgg: true,
		Dataset: trust.Item{Name: "icu", Class: trust.Confidential}, Now: 2})
	round := roundJob(run, 0, "s1", "s2", "s3")
	if r := applyEncoded(t, m, round); r.Refused() {
		t.Fatal(r.Refusal)
	}
	res := content.Hash([]byte("result"))
	sweepReport := ReportResult{Peer: "w1", Job: sweep.Job, Shard: 0, Result: res}
	roundReport := ReportResult{Peer: "s1", Job: round.Job, Shard: 0, Result: res}
	for _, c := range []struct {
		cmd  Command
		bulk bool
	}{
		{Lease{Peer: "w1"}, true},
		{Lease{Peer: "s1", Kinds: Kinds{KindGeneric}}, true},
		{Lease{Peer: "s1", Kinds: Kinds{KindRound}}, false},
		{Lease{Peer: "s1", Kinds: Kinds{KindGeneric, KindRound}}, false},
		{sweepReport, true},
		{roundReport, false},
		{ReportResult{Peer: "w1", Job: content.Hash([]byte("no such job"))}, false},
		{CommitResult{Peer: "w1", Job: sweep.Job}, true},
		{CommitResult{Peer: "s1", Job: round.Job}, false},
		{RenewLease{Peer: "w1", Job: sweep.Job}, true},
		{RenewLease{Peer: "s1", Job: round.Job}, false},
		{ReleaseLeases{Peer: "w1", Shards: []ShardRef{{Job: sweep.Job}}}, true},
		{ReleaseLeases{Peer: "w1", Shards: []ShardRef{{Job: sweep.Job}, {Job: round.Job}}}, false},
		{ReleaseLeases{Peer: "w1"}, false},
		{Batch{Commands: []Command{sweepReport, sweepReport}}, true},
		{Batch{Commands: []Command{sweepReport, roundReport}}, false},
		{Tick{Now: 5}, false},
		{sweepJob("another", 2, 6), false},
	} {
		if got := m.Bulk(c.cmd); got != c.bulk {
			t.Errorf("Bulk(%T %+v) = %v, want %v", c.cmd, c.cmd, got, c.bulk)
		}
	}
}
