package silo

import (
	"slices"
	"testing"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
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
