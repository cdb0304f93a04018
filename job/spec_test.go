package job

import (
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

const goodSpec = `name: sweep
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.1, 0.01], l2: [0, 1e-3]}
reducer: {use: collect, params: {metric: auc}}
params: {model: logistic, epochs: 3}
inputs:
  data: {path: d.csv, label: outcome, class: confidential}
verification: {replicas: 2}
limits: {steps: 100000}
`

func TestParseSpecGood(t *testing.T) {
	s, err := ParseSpec("job.yaml", []byte(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "sweep" || s.Program != "train-eval" || s.Partitioner.Ref != "grid" || s.Reducer.Ref != "collect" {
		t.Fatalf("bad spec: %+v", s)
	}
	lr := s.Partitioner.Params["lr"].([]any)
	if lr[0].(float64) != 0.1 || s.Partitioner.Params["l2"].([]any)[0].(int64) != 0 {
		t.Fatalf("bad params: %#v", s.Partitioner.Params)
	}
	if s.Inputs["data"].Label != "outcome" || s.Verification.Replicas != 2 || s.Limits.Steps != 100000 {
		t.Fatalf("bad spec: %+v", s)
	}
}

func TestParseSpecErrors(t *testing.T) {
	cases := []struct {
		name, src string
		code      diag.Code
		line      int
	}{
		{"syntax", "name: x\nprogram: [unclosed\n", diag.YAMLSyntax, 0},
		{"unknown key", "name: x\nprogram: p\npartitioner: grid\nreduce: sum\n", diag.UnknownKey, 4},
		{"wrong type", "name: [x]\nprogram: p\npartitioner: grid\n", diag.WrongType, 1},
		{"missing program", "name: x\npartitioner: grid\n", diag.MissingField, 1},
		{"bad regime", "name: x\nprogram: p\npartitioner: grid\nregime: public\n", diag.UnknownRegime, 4},
		{"input without label", "name: x\nprogram: p\npartitioner: grid\ninputs:\n  d: {path: a.csv}\n", diag.MissingField, 5},
		{"bad class", "name: x\nprogram: p\npartitioner: grid\ninputs:\n  d: {path: a.csv, label: y, class: secret}\n", diag.UnknownInputClass, 5},
		{"duplicate key", "name: x\nname: y\nprogram: p\npartitioner: grid\n", diag.ConfigDuplicate, 2},
		{"nan param", "name: x\nprogram: p\npartitioner: grid\nparams: {a: .nan}\n", diag.InvalidValue, 4},
		{"replicas range", "name: x\nprogram: p\npartitioner: grid\nverification: {replicas: 0}\n", diag.InvalidValue, 4},
		{"audit rate range", "name: x\nprogram: p\npartitioner: grid\nverification:\n  mode: adaptive\n  audit_one_in: 1001\n", diag.InvalidValue, 6},
		{"trust knob on a quorum job", "name: x\nprogram: p\npartitioner: grid\nverification: {trust_after: 3}\n", diag.InvalidValue, 4},
		{"empty", "", diag.MissingField, 1},
		{"unknown class target", "name: x\nprogram: p\npartitioner: grid\nclasses: {dataset: confidential}\n", diag.UnknownKey, 4},
		{"bad content class", "name: x\nprogram: p\npartitioner: grid\nclasses:\n  model: secret\n", diag.UnknownInputClass, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec("job.yaml", []byte(c.src))
			ds, ok := diag.As(err)
			if !ok {
				t.Fatalf("want diagnostic %s, got %v", c.code, err)
			}
			if ds[0].Code != c.code {
				t.Fatalf("want %s, got %v", c.code, ds)
			}
			if c.line > 0 && (ds[0].Pos == nil || ds[0].Pos.Line != c.line) {
				t.Fatalf("want line %d, got %+v", c.line, ds[0].Pos)
			}
		})
	}
}

func TestParseSpecReportsAllProblems(t *testing.T) {
	_, err := ParseSpec("job.yaml", []byte("name: 3\nprogramm: p\npartitioner: grid\ncolour: red\n"))
	ds, _ := diag.As(err)
	if len(ds) < 3 {
		t.Fatalf("want every problem at once, got %d: %v", len(ds), ds)
	}
	if !strings.Contains(ds.Error(), `did you mean "program"`) {
		t.Fatalf("no spelling hint: %v", ds)
	}
}

// FuzzParseSpec: the decoder of untrusted job files never panics, and
// whatever it accepts it accepts again identically.
func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte("name: x\nprogram: p\npartitioner: {use: grid, params: {a: [1,2]}}\n"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte("name: &a x\nprogram: *a\npartitioner: grid\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSpec("f.yaml", b)
		if err != nil {
			if _, ok := diag.As(err); !ok {
				t.Fatalf("non-diagnostic error: %v", err)
			}
			return
		}
		s2, err := ParseSpec("f.yaml", b)
		if err != nil || s2.Name != s.Name || s2.Program != s.Program {
			t.Fatal("accepted once, not twice")
		}
	})
}

// Classes enter the job ID (a classed job is another job) and admission
// (a confidential one is SC4003 on an open pool); a job without classes
// keeps the ID it had before classes existed.
func TestClassesInIDAndAdmission(t *testing.T) {
	src := "name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 100, chunks: 2}}\n"
	plain := compileFiles(t, map[string]string{"job.yaml": src})
	classed := compileFiles(t, map[string]string{"job.yaml": src + "classes: {model: confidential}\n"})
	if plain.ID == classed.ID {
		t.Fatal("classing the model did not change the job ID")
	}
	if plain.Bundle().Classes != nil || len(plain.AdmissionRequest().Models) != 0 {
		t.Fatal("an unclassed job carries classes")
	}
	ds := trust.Admit(trust.Open, classed.AdmissionRequest())
	if len(ds) != 1 || ds[0].Code != diag.OpenConfidential {
		t.Fatalf("admission on an open pool: %v", ds)
	}
	if b := classed.Bundle(); b.Classes["model"] != "confidential" {
		t.Fatalf("bundle classes %v", b.Classes)
	}
}
