package silo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/silo"
)

// A model error inside a silo (a label its binary model cannot take, at a
// known row) declines the round through the real appliance: the signed
// contribution every member reads holds only the code and that code's
// fixed title — no value, no row number — while the silo's own log keeps
// the full diagnostic. The declined round counts against the silo's daily
// round limit, also after a restart; rounds its policy refused before
// accepting them (here, noise below its minimum) do not: they are decided
// on public inputs alone, and counting them would let any member use up a
// site's rounds for the day with runs it refuses.
func TestModelErrorDeclinesWithCodeOnly(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	for _, n := range siloNames[:3] {
		w.openSilo(n, nil)
	}
	// hospital-d's data: row 3 has label 2 (its value and row number are
	// what must not leave the site).
	const bad = "hospital-d"
	dir := filepath.Join(w.dir, bad)
	os.MkdirAll(dir, 0o700)
	var csv strings.Builder
	csv.WriteString("x1,x2,x3,y\n")
	for i := range 40 {
		y := i % 2
		if i == 2 {
			y = 2
		}
		fmt.Fprintf(&csv, "%d,%g,%g,%d\n", i%5, float64(i)/40, 0.5, y)
	}
	os.WriteFile(filepath.Join(dir, "patients.csv"), []byte(csv.String()), 0o600)
	cfg := w.siloConfig(bad, nil)
	cfg.Policy.MaxRoundsPerDay = 1
	cfg.Policy.MinNoiseMultiplier = 1
	var mu sync.Mutex
	var logged []string
	a, err := silo.Open(cfg, w.ids[bad], w.fed, silo.Options{Logf: func(f string, args ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(f, args...))
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	a.RoundTimeout = time.Minute
	w.silos[bad] = a

	cat, _ := catalog.Builtin()
	spec := &fl.RunSpec{Name: "decline-test", Strategy: "fedavg", Params: map[string]any{"lr": 0.1, "epochs": int64(1)},
		Model: fl.ModelSpec{Kind: "logistic", Inputs: 3}, Dataset: "patients", Rounds: 2, MinCohort: 3,
		DP: true, Clip: 1, Sigma: 1.5, SecureAgg: true, Seed: 7, Standardize: fl.StandardizeLocal}
	global, err := fl.Init(context.Background(), script.Env{Catalog: cat}, mustResolve(t, w, cat, spec).st, 3)
	if err != nil {
		t.Fatal(err)
	}

	// Three rounds of a run whose noise is below the silo's minimum: each
	// refused by policy (SC9203), none counted against the daily limit.
	probe := *spec
	probe.Name, probe.Sigma = "probe", 0.5
	pr := mustResolve(t, w, cat, &probe)
	for r := range 3 {
		pjs, _ := w.startRound(pr.run, pr.canon, pr.st, global, r, siloNames)
		a.HandleRound(context.Background(), coordinator.LeaseGrant{Job: pjs.ID, Shard: 3, Expiry: time.Now().Add(time.Hour).UnixMilli()}, pjs)
		c := w.contribution(bad)
		if c.Record.Status != silo.Declined || len(c.Record.Refusals) == 0 || c.Record.Refusals[0].Code != diag.SiloNoiseTooLow {
			t.Fatalf("probe round %d: %+v, want a decline for noise below the minimum", r, c.Record)
		}
	}
	if recs, err := a.Rounds.AcceptedSince(time.Now().Add(-time.Hour)); err != nil || len(recs) != 0 {
		t.Fatalf("rounds refused by policy were counted against the daily limit: %+v (%v)", recs, err)
	}

	m := mustResolve(t, w, cat, spec)
	canon, runRef, st := m.canon, m.run, m.st
	js, b := w.startRound(runRef, canon, st, global, 0, siloNames)
	var wg sync.WaitGroup
	for i, n := range siloNames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.silos[n].HandleRound(context.Background(), coordinator.LeaseGrant{Job: js.ID, Shard: i, Expiry: time.Now().Add(time.Hour).UnixMilli()}, js)
		}()
	}
	if _, err := w.host.Wait(context.Background(), b.SecAgg.Round); err != nil {
		t.Fatalf("secure aggregation without the declining silo: %v", err)
	}
	wg.Wait()

	c := w.contribution(bad)
	if c.Record.Status != silo.Declined || len(c.Record.Refusals) != 1 || c.Record.LedgerEntry != "" {
		t.Fatalf("contribution: %+v", c.Record)
	}
	r := c.Record.Refusals[0]
	if r.Code == "" || r.Message != diag.Title(r.Code) {
		t.Fatalf("refusal %+v: want a code and its fixed title only", r)
	}
	raw, _ := json.Marshal(c.Record)
	for _, leak := range []string{"row", "label 2", "of a 2-class"} {
		if strings.Contains(string(raw), leak) {
			t.Fatalf("the contribution record quotes the silo's data (%q): %s", leak, raw)
		}
	}
	mu.Lock()
	full := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(full, "label 2 of row 3") || !strings.Contains(full, string(r.Code)) {
		t.Fatalf("the silo's own log lacks the full diagnostic:\n%s", full)
	}

	// The declined round used the silo's one round of the day, also after
	// a restart: the next round is refused with SC9205.
	a.Close()
	a2, err := silo.Open(cfg, w.ids[bad], w.fed, silo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	recs, err := a2.Rounds.AcceptedSince(time.Now().Add(-time.Hour))
	if err != nil || len(recs) != 1 || recs[0].Run != string(runRef) || recs[0].Round != 0 {
		t.Fatalf("after a restart the round log holds %+v (%v), want the declined round", recs, err)
	}
}

type resolvedRun struct {
	canon *fl.Canonical
	run   content.Ref
	st    *fl.Strategy
}

// mustResolve resolves spec and stores its canonical form where silos
// fetch it.
func mustResolve(t *testing.T, w *roundWorld, cat *catalog.Catalog, spec *fl.RunSpec) resolvedRun {
	t.Helper()
	canon, ref, st, err := spec.Resolve(cat, "")
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := content.Encode(canon)
	w.put(cb)
	return resolvedRun{canon, ref, st}
}
