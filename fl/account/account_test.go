package account

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/silo"
)

// fakeSource is a run's replicated jobs and blobs in memory.
type fakeSource struct {
	jobs  map[content.Ref]coordinator.JobStatus
	blobs map[content.Ref][]byte
}

func (f *fakeSource) Job(_ context.Context, id content.Ref) (coordinator.JobStatus, error) {
	js, ok := f.jobs[id]
	if !ok {
		return js, fmt.Errorf("no job %s", id.Short())
	}
	return js, nil
}

func (f *fakeSource) Blob(_ context.Context, ref content.Ref) ([]byte, error) {
	b, ok := f.blobs[ref]
	if !ok {
		return nil, fmt.Errorf("no blob %s", ref.Short())
	}
	return b, nil
}

func (f *fakeSource) put(t *testing.T, v any) content.Ref {
	t.Helper()
	b, err := content.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	ref := content.Hash(b)
	f.blobs[ref] = b
	return ref
}

// world is a federation of three silos and a source to put a run in.
type world struct {
	src  *fakeSource
	fed  *identity.Federation
	ids  map[string]*identity.Identity
	run  content.Ref
	mech []dp.Mechanism
}

func newWorld(t *testing.T) *world {
	w := &world{src: &fakeSource{jobs: map[content.Ref]coordinator.JobStatus{}, blobs: map[content.Ref][]byte{}},
		ids: map[string]*identity.Identity{}, run: content.Hash([]byte("run spec")), mech: []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}}
	var b strings.Builder
	b.WriteString("federation: t\nregime: consortium\nmembers:\n")
	agg, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "  - name: agg-1\n    role: aggregator\n    public_key: %s\n    address: 127.0.0.1:7000\n    raft_address: 127.0.0.1:7001\n", agg.Public())
	for _, s := range []string{"h1", "h2", "h3"} {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		w.ids[s] = id
		fmt.Fprintf(&b, "  - name: %s\n    role: silo\n    public_key: %s\n", s, id.Public())
	}
	fed, err := identity.ParseFederation("fed.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	w.fed = fed
	return w
}

// record signs a record of silo for round (charged when entry is set).
func (w *world) record(t *testing.T, s string, round int, job content.Ref, status string, entry content.Ref, eps, cumulative float64) content.Ref {
	t.Helper()
	c := silo.Contribution{Format: silo.ContributionFormat, Run: w.run, Round: round, Job: job, Silo: s, Dataset: "patients", Label: "outcome",
		Status: status, LedgerEntry: entry, Delta: 1e-5, Cumulative: cumulative, Budget: 10}
	if entry != "" {
		c.Mechanisms, c.Epsilon = w.mech, eps
	}
	if status == silo.Declined {
		c.Refusals = []silo.Refusal{{Code: diag.SiloBudgetOverdraft, Message: diag.Title(diag.SiloBudgetOverdraft)}}
	}
	sc, err := silo.Sign(w.ids[s], c)
	if err != nil {
		t.Fatal(err)
	}
	return w.src.put(t, sc)
}

// job adds a round job whose shards hold the given decided results (""
// for none) and extra reports.
func (w *world) job(name string, round int, state coordinator.JobState, decided []content.Ref, reports map[int][]content.Ref) content.Ref {
	id := content.Hash([]byte(name))
	js := coordinator.JobStatus{ID: id, Name: name, Run: w.run, Round: round, State: state, SubmittedAt: int64(1000 * (round + 1)), DoneAt: int64(1000*(round+1) + 500)}
	for i, res := range decided {
		s := coordinator.ShardStatus{Index: i, State: coordinator.StatePending}
		if res != "" {
			s.State, s.Result, s.Receipt = coordinator.StateVerified, res, uint64(10*round+i+1)
			s.Reports = append(s.Reports, coordinator.ReportInfo{Result: res})
		}
		for _, r := range reports[i] {
			s.Reports = append(s.Reports, coordinator.ReportInfo{Result: r})
		}
		js.Shards = append(js.Shards, s)
	}
	w.src.jobs[id] = js
	return id
}

// result puts the round result a job produced.
func (w *world) result(t *testing.T, round int, job content.Ref, participants ...string) content.Ref {
	t.Helper()
	g, err := fl.Global{"w": []float64{float64(round)}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return w.src.put(t, fl.RoundResult{Format: fl.RoundResultFormat, Run: w.run, Round: round, Job: job, Model: content.Hash(g), Global: g,
		Metrics: map[string]float64{}, Participants: participants, Dropped: []string{}, Step: fl.StepTrain})
}

// A retried round: its first attempt was abandoned after h1 and h2 paid
// and h3 declined it, the retry (h1, h2 re-sending, h3 paying) produced
// step 0, and step 1 went through at once with h3 declining. Each step's ε and declines come
// from its own attempts, whatever the job list's indexes are; each charge
// is counted once, in the step and in the datasets.
func TestRetriedRoundStepsAndCharges(t *testing.T) {
	w := newWorld(t)
	e := func(s string, r int) content.Ref { return content.Hash([]byte(fmt.Sprintf("entry %s %d", s, r))) }
	abandoned := content.Hash([]byte("attempt 0a"))
	h1a := w.record(t, "h1", 0, abandoned, silo.Failed, e("h1", 0), 0.5, 0.5)
	h2a := w.record(t, "h2", 0, abandoned, silo.Failed, e("h2", 0), 0.5, 0.5)
	h3a := w.record(t, "h3", 0, abandoned, silo.Declined, "", 0, 0) // refused the first attempt, took part in the retry
	w.job("attempt 0a", 0, coordinator.JobAbandoned, []content.Ref{"", "", h3a}, map[int][]content.Ref{0: {h1a}, 1: {h2a}})
	retry := content.Hash([]byte("attempt 0b"))
	w.job("attempt 0b", 0, coordinator.JobDone, []content.Ref{
		w.record(t, "h1", 0, retry, silo.Contributed, e("h1", 0), 0.5, 0.5), // re-sent: the same entry
		w.record(t, "h2", 0, retry, silo.Contributed, e("h2", 0), 0.5, 0.5),
		w.record(t, "h3", 0, retry, silo.Contributed, e("h3", 0), 0.5, 0.5),
	}, nil)
	one := content.Hash([]byte("round 1"))
	w.job("round 1", 1, coordinator.JobDone, []content.Ref{
		w.record(t, "h1", 1, one, silo.Contributed, e("h1", 1), 0.25, 0.65),
		w.record(t, "h2", 1, one, silo.Contributed, e("h2", 1), 0.25, 0.65),
		w.record(t, "h3", 1, one, silo.Declined, "", 0, 0.5),
	}, nil)
	st := coordinator.RunStatus{ID: w.run, Name: "r", Rounds: 2, State: coordinator.RunDone,
		Jobs: []content.Ref{abandoned, retry, one}, Models: []content.Ref{w.result(t, 0, retry, "h1", "h2", "h3"), w.result(t, 1, one, "h1", "h2")}}

	a, err := NewReader(w.src, w.fed).Run(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Steps) != 2 {
		t.Fatalf("%d steps", len(a.Steps))
	}
	s0, s1 := a.Steps[0].Summary, a.Steps[1].Summary
	if len(a.Steps[0].Attempts) != 2 || len(s0.Declined) != 0 || len(s0.Epsilon) != 3 || s0.Epsilon["h1"] != 0.5 || s0.Epsilon["h3"] != 0.5 {
		t.Errorf("step 0: attempts %v, ε %v, declined %v; want both attempts, 0.5 each, no decline", a.Steps[0].Attempts, s0.Epsilon, s0.Declined)
	}
	if a.Steps[1].Attempts[0] != one || s1.Epsilon["h1"] != 0.25 || s1.Declined["h3"] == "" {
		t.Errorf("step 1: attempts %v, ε %v, declined %v; want h1 0.25 and h3's decline", a.Steps[1].Attempts, s1.Epsilon, s1.Declined)
	}
	if _, ok := s1.Epsilon["h3"]; ok {
		t.Errorf("step 1 charges h3, which declined: %v", s1.Epsilon)
	}
	if a.Steps[0].DoneAt != 1500 {
		t.Errorf("step 0 done at %d, want the retry's 1500", a.Steps[0].DoneAt)
	}
	byName := map[string]Dataset{}
	for _, d := range a.Datasets {
		byName[d.Silo] = d
	}
	h1, h3 := byName["h1"], byName["h3"]
	if h1.Rounds != 2 || h1.Charges[0].Receipt == 0 || h1.Charges[0].AbandonedJob != "" || h1.LedgerEps != 0.65 || !h1.Verified {
		t.Errorf("h1: %+v, want two charges, round 0 proved by the retry's receipt, ledger ε 0.65", h1)
	}
	if h3.Rounds != 1 || h3.Declined != 1 || h3.LedgerEps != 0.5 {
		t.Errorf("h3: %+v, want one charge and one round declined (round 0's refused attempt was retried with h3)", h3)
	}
	if a.Label() != "outcome" {
		t.Errorf("label %q", a.Label())
	}
	// A watch reading from step 1 on reads only step 1's job.
	steps, err := NewReader(w.src, w.fed).Steps(context.Background(), st, 1)
	if err != nil || len(steps) != 1 || steps[0].Summary.Declined["h3"] == "" || len(steps[0].Attempts) != 1 {
		t.Fatalf("steps from 1: %+v %v", steps, err)
	}
}

// A record signed by another key than its silo's counts as unverified.
func TestForgedRecordIsUnverified(t *testing.T) {
	w := newWorld(t)
	job := content.Hash([]byte("round 0"))
	c := silo.Contribution{Format: silo.ContributionFormat, Run: w.run, Job: job, Silo: "h1", Dataset: "patients", Status: silo.Contributed}
	sc, err := silo.Sign(w.ids["h2"], c) // h2 signs as h1
	if err != nil {
		t.Fatal(err)
	}
	w.job("round 0", 0, coordinator.JobDone, []content.Ref{w.src.put(t, sc)}, nil)
	st := coordinator.RunStatus{ID: w.run, Jobs: []content.Ref{job}, Models: []content.Ref{w.result(t, 0, job, "h1")}}
	a, err := NewReader(w.src, w.fed).Run(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Records) != 1 || a.Records[0].Verified || a.Datasets[0].Verified {
		t.Fatalf("a forged record counts as verified: %+v", a.Records)
	}
}

// A charge is counted once however many records name it, with the receipt
// as its proof when one exists; a charge only an abandoned attempt's
// record names is listed with that job instead of a receipt.
func TestDatasetsAbandonedAttempts(t *testing.T) {
	m := []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}
	rec := func(round int, status string, entry content.Ref) silo.Contribution {
		return silo.Contribution{Silo: "h1", Dataset: "patients", Round: round, Status: status, LedgerEntry: entry, Mechanisms: m, Epsilon: 0.5, Delta: 1e-5}
	}
	e0, e1 := content.Hash([]byte("entry 0")), content.Hash([]byte("entry 1"))
	job := content.Hash([]byte("abandoned job"))
	rows, err := Datasets([]Record{
		{Contribution: rec(0, silo.Failed, e0), Proof: ByAbandoned, ReportedTo: job, Ref: content.Hash([]byte("r0"))}, // paid, then abandoned
		{Contribution: rec(0, silo.Contributed, e0), Proof: ByReceipt, Receipt: 7},                                    // the retry re-sent it
		{Contribution: rec(1, silo.Failed, e1), Proof: ByAbandoned, ReportedTo: job, Ref: content.Hash([]byte("r1"))}, // paid, never retried
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Rounds != 2 || len(rows[0].Charges) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	c0, c1 := rows[0].Charges[0], rows[0].Charges[1]
	if c0.Receipt != 7 || c0.AbandonedJob != "" || c0.LedgerEntry != e0 {
		t.Errorf("round 0: %+v, want the receipt as proof", c0)
	}
	if c1.Receipt != 0 || c1.AbandonedJob != job || c1.LedgerEntry != e1 || c1.Status != "failed (abandoned attempt)" {
		t.Errorf("round 1: %+v, want the abandoned job as proof", c1)
	}
}

// A record a silo delivered from its outbox after the round was reduced
// without it has no receipt: its charge is listed with the job as late.
func TestDatasetsLateRecord(t *testing.T) {
	m := []dp.Mechanism{dp.SubsampledGaussian(2, 1, 1)}
	e := content.Hash([]byte("entry"))
	job := content.Hash([]byte("reduced job"))
	rows, err := Datasets([]Record{
		{Contribution: silo.Contribution{Silo: "h1", Dataset: "patients", Round: 3, Status: silo.Failed, LedgerEntry: e, Mechanisms: m, Epsilon: 0.5, Delta: 1e-5},
			Proof: ByLate, ReportedTo: job, Ref: content.Hash([]byte("r"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Rounds != 1 || rows[0].RunEps <= 0 {
		t.Fatalf("rows %+v", rows)
	}
	if c := rows[0].Charges[0]; c.LateJob != job || c.AbandonedJob != "" || c.Status != "failed (late record)" {
		t.Errorf("charge %+v, want the reduced job as proof of a late record", c)
	}
}

// The curve note says why a run has nothing to draw, and what a DP run's
// points are: a training round under DP releases no loss.
func TestCurveNote(t *testing.T) {
	train := Step{Summary: fl.RoundSummary{Sums: map[string]float64{"examples": 10, "loss": 5}}}
	update := Step{Summary: fl.RoundSummary{Sums: map[string]float64{}}} // a DP training round: the update alone
	eval := Step{Summary: fl.RoundSummary{Sums: map[string]float64{"eval_examples": 8}, EvalRows: 8}}
	for _, c := range []struct {
		name  string
		spec  fl.RunSpec
		steps []Step
		want  string
	}{
		{"plain run with curves", fl.RunSpec{}, []Step{train}, ""},
		{"plain run, nothing yet", fl.RunSpec{}, nil, "no step of the run has completed yet"},
		{"DP without an evaluation", fl.RunSpec{DP: true}, []Step{update, update}, "declares no charged evaluation"},
		{"DP, evaluation to come", fl.RunSpec{DP: true, Eval: fl.EvalSpec{Holdout: 0.2}}, []Step{update}, "has released no result yet"},
		{"DP with the evaluation's points", fl.RunSpec{DP: true, Eval: fl.EvalSpec{Holdout: 0.2}}, []Step{update, eval}, "these points are the run's charged, noised evaluation"},
	} {
		got := CurveNote(&c.spec, c.steps)
		if (c.want == "" && got != "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
