package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
)

// fl simulate samples and straggles the sites a live run of the same spec
// would: each training round's participants are RunSpec.RoundCohort of the
// run's ID and the coordinator round (the leader's draw), not a draw of the
// simulation's own. Real binary, six small sites, three rounds.
func TestFLSimulateSamplesAsTheLivePath(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	dir := t.TempDir()
	mustRun(t, scellisCmd(t, dir, "datagen", "hospitals", "--sites", "6", "--rows", "60", "--seed", "5", "--out", "sites"))
	spec := `name: sampled
strategy: {use: fedprox, params: {mu: 0.1, lr: 0.5, epochs: 2}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
cohort: {sample: 0.5, stragglers: 0.5}
rounds: 3
privacy: {dp: false}
seed: 11
`
	if err := os.WriteFile(filepath.Join(dir, "run.yaml"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, scellisCmd(t, dir, "--json", "fl", "simulate", "run.yaml", "--data", "sites", "--out", "model.json"))
	mf, err := fl.ReadModelFile(filepath.Join(dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := fl.LoadRunSpec(filepath.Join(dir, "run.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"hospital-1", "hospital-2", "hospital-3", "hospital-4", "hospital-5", "hospital-6"}
	trains := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var row fl.RoundSummary
		if json.Unmarshal([]byte(line), &row) != nil || row.Step != fl.StepTrain {
			continue
		}
		trains++
		want, _ := rs.RoundCohort(mf.Run.ID, row.Round, fl.StepTrain, names)
		if !slices.Equal(row.Participants, want) {
			t.Errorf("round %d: simulated cohort %v, the live path samples %v", row.Round, row.Participants, want)
		}
		if len(row.Participants) != 3 {
			t.Errorf("round %d: %d sites, want round(0.5·6) = 3", row.Round, len(row.Participants))
		}
	}
	if trains != 3 {
		t.Fatalf("%d training rounds in the output:\n%s", trains, out)
	}
}
