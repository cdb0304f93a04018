package silo

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// A phase's error is the attempt's outcome: a decline and a failure are
// reported (their codes in the record, the lease kept), any other error
// hands the lease back, and an attempt whose keys are in the round's key
// exchange never hands it back.
func TestAttemptOutcomes(t *testing.T) {
	a := &Appliance{Name: "h1"}
	run := content.Hash([]byte("run"))
	refused := diag.New(diag.SiloBudgetOverdraft, "r", "over budget")
	cases := []struct {
		name     string
		err      error
		status   string
		code     diag.Code
		handBack bool
	}{
		{"contributed", nil, "", "", false},
		{"declined", decline(refused), Declined, diag.SiloBudgetOverdraft, false},
		{"failed", failErr{error: refused, in: ": secure aggregation"}, Failed, diag.SiloBudgetOverdraft, false},
		{"retried", fmt.Errorf("fetching the round bundle: %w", errors.New("unreachable")), "", "", true},
		// A decline wrapped by a retry is a retry: only the phase's own
		// verdict counts.
		{"wrapped", fmt.Errorf("x: %w", decline(refused)), "", "", true},
	}
	for _, c := range cases {
		at := a.newAttempt(coordinator.LeaseGrant{Shard: 3}, coordinator.JobStatus{Run: run, Round: 2})
		rec, err := at.finish(c.err)
		if (err != nil) != c.handBack {
			t.Errorf("%s: handed back = %v, want %v", c.name, err != nil, c.handBack)
		}
		if rec.Status != c.status || rec.Run != run || rec.Round != 2 || rec.Shard != 3 {
			t.Errorf("%s: record %+v, want status %q for run %s round 2 shard 3", c.name, rec, c.status, run.Short())
		}
		if c.code != "" && (len(rec.Refusals) != 1 || rec.Refusals[0].Code != c.code) {
			t.Errorf("%s: refusals %+v, want %s", c.name, rec.Refusals, c.code)
		}
	}
	at := a.newAttempt(coordinator.LeaseGrant{}, coordinator.JobStatus{Run: run})
	if err := at.unsent(errors.New("x")); errors.As(err, new(failErr)) {
		t.Errorf("without a key exchange, an unsent round is handed back; got %v", err)
	}
	at.kx = &keyExchange{}
	if err := at.unsent(errors.New("x")); !errors.As(err, new(failErr)) {
		t.Errorf("with this silo's keys in the round, an unsent round fails; got %v", err)
	}
}

// The round's lock is held from admit to the charge; closing the attempt
// ends it however the attempt ended, and ending it twice is harmless.
func TestAttemptLock(t *testing.T) {
	a := &Appliance{Name: "h1"}
	first := a.newAttempt(coordinator.LeaseGrant{}, coordinator.JobStatus{})
	first.consumer = "run/round-0"
	if err := first.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := a.newAttempt(coordinator.LeaseGrant{}, coordinator.JobStatus{})
	second.consumer = first.consumer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := second.lock(ctx); err == nil {
		t.Fatal("a second attempt took the round's lock while the first held it")
	}
	first.unlock() // release ends it at the charge ...
	first.close()  // ... and close again: harmless
	if err := second.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	second.close()
}

// A retried round the silo paid for restores exactly the cached release
// (input, weight, client state) and charges nothing; a cache for another
// model is declined, with the charge named in the record.
func TestAttemptRestore(t *testing.T) {
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	a := &Appliance{Name: "h1", ID: id, Config: &config.Silo{DataDir: t.TempDir()}}
	run := content.Hash([]byte("run"))
	global := content.Hash([]byte("global"))
	b := fl.RoundBundle{Run: run, Global: global, UpdateDim: 2, SecAgg: secagg.Params{Round: "r", Dim: 2, Clip: 10, Weighted: true, MaxWeight: 100}}
	b.SecAgg.Members = append(b.SecAgg.Members, secagg.Member{ID: "h1", Key: id.Public().Ed25519()})
	for i := range 2 {
		b.SecAgg.Members = append(b.SecAgg.Members, secagg.Member{ID: fmt.Sprint("s", i), Key: ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey)})
	}
	state, err := fl.EncodeState(map[string]any{"c": []float64{1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.saveReleased(released{Format: releasedFormat, Run: run, Round: 1, Global: global, Values: []float64{0.5, -1}, Weight: 3, State: state}); err != nil {
		t.Fatal(err)
	}
	paid := &dp.Entry{Hash: content.Hash([]byte("entry")), Charge: &dp.Charge{Epsilon: 0.5}}
	attempt := func(from content.Ref) *roundAttempt {
		at := a.newAttempt(coordinator.LeaseGrant{}, coordinator.JobStatus{Run: run, Round: 1})
		at.b, at.from, at.paid, at.stopGlobal = b, from, paid, func() {}
		return at
	}
	at := attempt(global)
	if err := at.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(at.in.Values, []float64{0.5, -1}) || at.in.Weight != 3 || !at.keepState || at.out.State["c"] == nil || at.digest == "" {
		t.Fatalf("restored input %+v (keep state %v, state %v, digest %q), want the cached release", at.in, at.keepState, at.out.State, at.digest)
	}
	if at.rec.LedgerEntry != paid.Hash || at.rec.Epsilon != 0.5 {
		t.Errorf("the record names charge %s ε %v, want the earlier attempt's", at.rec.LedgerEntry.Short(), at.rec.Epsilon)
	}
	other := attempt(content.Hash([]byte("another model")))
	rec, err := other.finish(other.restore(context.Background()))
	if err != nil || rec.Status != Declined || len(rec.Refusals) != 1 || rec.Refusals[0].Code != diag.RunBadRound || rec.LedgerEntry != paid.Hash {
		t.Fatalf("a release trained from another model: record %+v, %v; want declined %s naming the charge", rec, err, diag.RunBadRound)
	}
}

// admit's request is the run's spec read with the round's parameters: a
// round that forms its sum otherwise than its run asks (threshold-he for
// a masking run, another masking protocol) is declined before the policy
// is asked; one that agrees gives the policy its cohort, threshold,
// protocol and grid.
func TestAttemptRequestAgreesWithRun(t *testing.T) {
	a := &Appliance{Name: "h1", Config: &config.Silo{Datasets: []config.Dataset{{Name: "d", Label: "y", Unit: fl.UnitSilo}}}, Fed: &identity.Federation{}}
	b := fl.RoundBundle{Step: fl.StepTrain, UpdateDim: 2, SecAgg: secagg.Params{Round: "r", Dim: 2, Clip: 10, Weighted: true, MaxWeight: 100, Protocol: secagg.Pairwise}}
	for i := range 4 {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(i)
		b.SecAgg.Members = append(b.SecAgg.Members, secagg.Member{ID: fmt.Sprint("s", i), Key: ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)})
	}
	attempt := func(spec fl.RunSpec) (*roundAttempt, error) {
		at := a.newAttempt(coordinator.LeaseGrant{}, coordinator.JobStatus{Run: content.Hash([]byte("run")), Round: 1})
		at.b, at.spec = b, fl.Canonical{Spec: spec}
		return at, at.request()
	}
	for _, spec := range []fl.RunSpec{
		{Dataset: "d", Aggregation: fl.AggThresholdHE, SecureAgg: true},
		{Dataset: "d", Masking: string(secagg.SecAggPlus), SecureAgg: true},
	} {
		_, err := attempt(spec)
		d, ok := err.(declineErr)
		if ds, isDiag := diag.As(d.error); !ok || !isDiag || ds[0].Code != diag.RunBadRound {
			t.Errorf("run asking for aggregation %q masking %q: %v, want a %s decline", spec.Aggregation, spec.Masking, err, diag.RunBadRound)
		}
	}
	at, err := attempt(fl.RunSpec{Dataset: "d", Masking: string(secagg.Pairwise), SecureAgg: true})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := b.SecAgg.EffectiveThreshold()
	grid, _ := b.SecAgg.FracBits()
	r := at.req
	if r.Cohort != 4 || r.Threshold != want || r.Masking != secagg.Pairwise || r.Aggregation != fl.AggMasking || r.Privacy.GridBits != grid || r.Dataset != "d" || at.rec.Label != "y" {
		t.Errorf("request %+v (label %q), want cohort 4, threshold %d, pairwise masking, grid %d, dataset d labelled y", r, at.rec.Label, want, grid)
	}
	// A trainer run's model is the trainer's: its size, from the run,
	// is what policy.max_model_params bounds (SC9213), not the built-in
	// model spec's (which a trainer run does not have).
	at.b, at.spec = b, fl.Canonical{Spec: fl.RunSpec{Dataset: "d", Masking: string(secagg.Pairwise), SecureAgg: true},
		Trainer: content.Hash([]byte("trainer")), TrainerParams: 2650}
	if err := at.request(); err != nil {
		t.Fatal(err)
	}
	if at.req.ModelParams != 2650 || at.req.RoundValues != 2650+b.SecAgg.Dim {
		t.Errorf("a trainer run's request: %d model parameters, %d round values; want 2650 and %d", at.req.ModelParams, at.req.RoundValues, 2650+b.SecAgg.Dim)
	}
	p := Policy{MaxModelParams: 2000}
	if ds := p.checkSize(at.req); len(ds) != 1 || ds[0].Code != diag.SiloModelTooLarge {
		t.Errorf("a trainer of 2650 weights under max_model_params 2000: %v", ds)
	}
}
