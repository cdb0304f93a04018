package silo

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/model"
)

// A trainer round is accepted only for a trainer the policy lists by its
// content hash (SC9502 otherwise, the policy's trainers named) and only at
// the silo level (SC9510 at the record level: a trainer's DP-SGD is not
// trusted); a round without a trainer is not affected by the list.
func TestCheckRoundTrainers(t *testing.T) {
	cnn := content.Hash([]byte("cnn trainer bundle"))
	p := basePolicy(nil)
	p.MaxRoundsPerDay, p.MaxEpsilonPerRound = 0, 0
	p.Trainers = []config.Trainer{{Name: "cnn", Hash: string(cnn), Interpreter: "/usr/bin/python3"}}
	silo := fl.Privacy{Unit: fl.UnitSilo, Clip: 1, Sigma: 1.5}
	ledger := fakeLedger{budgets: map[string]config.Budget{"registry": {Epsilon: 8, Delta: 1e-6}, "cardio": {Epsilon: 3, Delta: 1e-5}}}
	codes := func(req RoundRequest) []diag.Code {
		var out []diag.Code
		for _, d := range p.CheckRound(req, ledger, now) {
			out = append(out, d.Code)
		}
		return out
	}
	req := baseRequest()
	req.Dataset, req.Privacy, req.Trainer = "registry", silo, cnn
	if c := codes(req); len(c) != 0 {
		t.Fatalf("an allowed trainer at the silo level: %v", c)
	}
	req.Trainer = content.Hash([]byte("another trainer"))
	if c := codes(req); !slices.Equal(c, []diag.Code{diag.TrainerNotAllowed}) {
		t.Fatalf("a trainer the policy does not list: %v", c)
	}
	req.Trainer = ""
	if c := codes(req); len(c) != 0 {
		t.Fatalf("a round without a trainer: %v", c)
	}
	req = baseRequest() // cardio, record level
	req.Trainer = cnn
	if c := codes(req); !slices.Contains(c, diag.TrainerUnit) || slices.Contains(c, diag.TrainerNotAllowed) {
		t.Fatalf("an allowed trainer at the record level: %v", c)
	}
}

// The files a trainer reads follow the run's evaluation: the dataset's
// own file without one; with evaluation.dataset, that dataset's file as
// the held-out rows; with evaluation.holdout, the dataset written in two
// parts for the step — exactly the rows fl.HoldOut holds out for a
// built-in model, and the rest to train on — removed afterwards.
func TestTrainerFiles(t *testing.T) {
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("x1,x2,y\n")
	for i := range 40 {
		fmt.Fprintf(&csv, "%d,%g,%d\n", i, float64(i)/4, i%2)
	}
	path := filepath.Join(dir, "rows.csv")
	if err := os.WriteFile(path, []byte(csv.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	rows, err := model.LoadCSV(path, "y")
	if err != nil {
		t.Fatal(err)
	}
	a := &Appliance{Name: "h1", Data: map[string]*model.Dataset{"rows": rows}, Config: &config.Silo{DataDir: filepath.Join(dir, "data"),
		Datasets: []config.Dataset{{Name: "rows", Path: path, Label: "y"}, {Name: "test", Path: "/data/test.csv", Label: "outcome"}}}}
	run := content.Hash([]byte("run"))
	files := func(ev fl.EvalSpec) trainerFiles {
		t.Helper()
		f, err := a.trainerFiles(run, &fl.Canonical{Spec: fl.RunSpec{Dataset: "rows", Eval: ev}}, "test")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := files(fl.EvalSpec{}); f.train != path || f.trainLabel != "y" || f.held != "" {
		t.Fatalf("without evaluation: %+v", f)
	}
	if f := files(fl.EvalSpec{Dataset: "test"}); f.train != path || f.held != "/data/test.csv" || f.heldLabel != "outcome" {
		t.Fatalf("with an evaluation dataset: %+v", f)
	}
	_, err = a.trainerFiles(run, &fl.Canonical{Spec: fl.RunSpec{Dataset: "rows", Eval: fl.EvalSpec{Dataset: "nope"}}}, "test")
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.SiloUnknownDataset {
		t.Fatalf("an evaluation dataset the silo lacks: %v", err)
	}
	f := files(fl.EvalSpec{Holdout: 0.25})
	wantTrain, wantHeld, err := fl.HoldOut(run, "h1", rows, 0.25)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []struct {
		path string
		want *model.Dataset
	}{{f.train, wantTrain}, {f.held, wantHeld}} {
		got, err := model.LoadCSV(part.path, f.trainLabel)
		if err != nil {
			t.Fatal(err)
		}
		if got.Rows() != part.want.Rows() || !slices.Equal(got.Y, part.want.Y) || !slices.Equal(got.X.RawMatrix().Data, part.want.X.RawMatrix().Data) {
			t.Fatalf("%s holds %d rows, not the %d fl.HoldOut gives", filepath.Base(part.path), got.Rows(), part.want.Rows())
		}
	}
	if wantHeld.Rows() != 10 || f.heldLabel != "y" {
		t.Fatalf("held out %d rows labelled %q", wantHeld.Rows(), f.heldLabel)
	}
	f.remove()
	if _, err := os.Stat(filepath.Dir(f.train)); !os.IsNotExist(err) {
		t.Fatalf("the step's split is still there: %v", err)
	}
}
