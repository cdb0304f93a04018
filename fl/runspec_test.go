package fl

import (
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
)

const goodRun = `name: fedprox-hospitals
strategy: {use: fedprox, params: {mu: 0.1, lr: 0.1, epochs: 1}}
model: {kind: logistic, inputs: 9}
dataset: patients
rounds: 20
cohort: {silos: [h1, h2, h3, h4], min: 3}
privacy: {clip: 1.0, sigma: 1.1, q: 0.05, steps: 20, feature_bounds: [120, 1, 80, 300, 600, 500, 1, 40, 20]}
secure_aggregation: true
seed: 7
`

func TestRunSpecParsesAndResolves(t *testing.T) {
	s, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil {
		t.Fatal(err)
	}
	if s.Rounds != 20 || len(s.Silos) != 4 || s.Privacy(UnitRecord).Sigma != 1.1 || !s.SecureAgg {
		t.Fatalf("%+v", s)
	}
	cat, _ := catalog.Builtin()
	_, id1, st, err := s.Resolve(cat, ".")
	if err != nil || st.Entry.Name != "fedprox" {
		t.Fatal(err)
	}
	s.Rounds = 21
	_, id2, _, _ := s.Resolve(cat, ".")
	if id1 == id2 {
		t.Fatal("changing the rounds kept the run ID")
	}
}

func TestRunSpecReportsEveryProblem(t *testing.T) {
	_, err := ParseRunSpec("run.yaml", []byte("name: x\nstrategy: fedavg\nrounds: 0\nprivacy: {sigma: 1}\ncohort: {min: 2}\ncolour: red\n"))
	ds, ok := diag.As(err)
	if !ok || len(ds) < 4 {
		t.Fatalf("want every problem at once, got %v", err)
	}
}
