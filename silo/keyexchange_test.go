package silo_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/silo"
)

// A silo that declines after its key exchange started — its rows do not
// fit the run's model, found once its data is read, after its policy
// accepted the round and while the other silos' keys were being
// exchanged — sends no masked input and is charged nothing; excused (as
// the aggregator excuses a silo whose declined record is reported), it
// leaves the round to the three others, whose inputs all arrived after
// their charges (law 6).
func TestDeclineAfterKeyExchange(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	// hospital-d's rows have four features; the run's model takes three.
	dir := filepath.Join(w.dir, "hospital-d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var csv bytes.Buffer
	csv.WriteString("x1,x2,x3,x4,y\n")
	for i := range 60 {
		fmt.Fprintf(&csv, "%g,%g,%g,%g,%d\n", float64(i%5)/5, float64(i%3)/3, float64(i%7)/7, float64(i%2), i%2)
	}
	if err := os.WriteFile(filepath.Join(dir, "patients.csv"), csv.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range siloNames {
		w.openSilo(n, nil)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	spec := &fl.RunSpec{Name: "decline-after-keys", Strategy: "fedavg", Params: map[string]any{"lr": 0.1, "epochs": int64(1)},
		Model: fl.ModelSpec{Kind: "logistic", Inputs: 3}, Dataset: "patients", Rounds: 1, MinCohort: 3,
		DP: true, Clip: 1, Sigma: 1.5, SecureAgg: true, Seed: 7, Standardize: fl.StandardizeLocal}
	canon, runRef, st, err := spec.Resolve(cat, "")
	if err != nil {
		t.Fatal(err)
	}
	cb, err := content.Encode(canon)
	if err != nil {
		t.Fatal(err)
	}
	w.put(cb)
	global, err := fl.Init(context.Background(), script.Env{Catalog: cat}, st, 3)
	if err != nil {
		t.Fatal(err)
	}
	js, b := w.startRound(runRef, canon, st, global, 0, siloNames)
	var wg sync.WaitGroup
	for i, n := range siloNames {
		a := w.silos[n]
		wg.Go(func() {
			a.HandleRound(context.Background(), coordinator.LeaseGrant{Job: js.ID, Shard: i, Expiry: time.Now().Add(time.Hour).UnixMilli()}, js)
			if n == "hospital-d" {
				w.host.Excuse(b.SecAgg.Round, n) // its record is reported: HandleRound returned
			}
		})
	}
	res, err := w.host.Wait(context.Background(), b.SecAgg.Round)
	if err != nil {
		t.Fatalf("secure aggregation: %v", err)
	}
	wg.Wait()
	if !slices.Equal(res.Contributors, siloNames[:3]) {
		t.Errorf("contributors %v, want %v", res.Contributors, siloNames[:3])
	}
	d := w.contribution("hospital-d")
	if d.Record.Status != silo.Declined || len(d.Record.Refusals) == 0 || d.Record.LedgerEntry != "" {
		t.Fatalf("hospital-d: %+v", d.Record)
	}
	if stt, _ := w.silos["hospital-d"].Ledger.Status("patients"); stt.Spent != 0 || stt.Charges != 0 {
		t.Errorf("hospital-d spent ε = %v (%d charges) for a round it declined", stt.Spent, stt.Charges)
	}
	for _, n := range siloNames[:3] {
		if c := w.contribution(n); c.Record.Status != silo.Contributed || c.Record.LedgerEntry == "" {
			t.Errorf("%s: %+v", n, c.Record)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.badOrder) > 0 {
		t.Errorf("masked inputs arrived before their ledger charge: %v", w.badOrder)
	}
	if w.masked["hospital-d"] {
		t.Errorf("hospital-d sent a masked input for a round it declined")
	}
}
