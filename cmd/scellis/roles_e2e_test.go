package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// refused runs a client command as `as` and checks it is refused with exit
// code 2 and a diagnostic carrying code and every word of want.
func (c *cluster) refused(as, code string, want []string, args ...string) {
	c.t.Helper()
	out, errs, err := c.cli(as, args...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		c.t.Fatalf("scellis %v as %s: %v, want exit code 2\n%s%s", args, as, err, out, errs)
	}
	for _, w := range append([]string{code}, want...) {
		if !strings.Contains(errs, w) {
			c.t.Fatalf("scellis %v as %s: the refusal does not say %q:\n%s", args, as, w, errs)
		}
	}
}

// Roles through the real binary: silos and workers submit and launch
// nothing; a researcher cancels only what it submitted; an operator
// cancels anything. Every refusal is a 403 with SC7108 and a diagnostic
// that says who may.
func TestRolesThroughTheBinary(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process roles test")
	}
	c := newCluster(t, "own", 1, member{"alice", "researcher"}, member{"bob", "researcher"},
		member{"w1", "worker"}, member{"h1", "silo"}, member{"ops", "operator"})
	c.startAggregators()
	job := c.montecarlo("owned", 2)
	for _, as := range []string{"w1", "h1", "ops"} {
		c.refused(as, "SC7108", []string{"POST /v1/jobs", "researcher"}, "job", "submit", job)
	}
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", job))
	var st struct{ Submitter, State string }
	if err := json.Unmarshal([]byte(c.mustCLI("bob", "--json", "job", "status", id)), &st); err != nil {
		t.Fatal(err)
	}
	if st.Submitter != "alice" {
		t.Fatalf("the job records submitter %q, want alice", st.Submitter)
	}
	if out := c.mustCLI("bob", "job", "status", id); !strings.Contains(out, "submitted by alice") {
		t.Fatalf("job status does not say who submitted the job:\n%s", out)
	}
	// Another researcher may not cancel alice's job; a worker or a silo
	// may not cancel at all; the state is as it was.
	before := c.statuses("alice")["agg-1"].StateHash
	c.refused("bob", "SC7108", []string{"alice", "operator"}, "job", "cancel", id)
	c.refused("w1", "SC7108", []string{"researcher or operator"}, "job", "cancel", id)
	c.refused("h1", "SC7108", []string{"researcher or operator"}, "job", "cancel", id)
	if s := c.status("alice", id); s.State != "running" {
		t.Fatalf("after refused cancels the job is %s, want running", s.State)
	}
	if after := c.statuses("alice")["agg-1"].StateHash; before == "" || after != before {
		t.Fatalf("refused cancels changed the state hash: %s → %s", before, after)
	}
	if out := c.mustCLI("ops", "job", "cancel", id, "--reason", "maintenance"); !strings.Contains(out, "cancelled") {
		t.Fatalf("operator cancel: %s", out)
	}
	// A worker or a silo may not launch a training run against the silos.
	c.write("run.yaml", "name: forbidden\nstrategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}\nmodel: {kind: logistic, inputs: 9}\ndataset: patients\nrounds: 1\nprivacy: {dp: false}\nsecure_aggregation: true\n")
	for _, as := range []string{"w1", "h1"} {
		c.refused(as, "SC7108", []string{"POST /v1/runs", "researcher"}, "fl", "launch", "run.yaml")
	}
}

// SC4003 through the real binary: on an open pool a job whose content is
// classed confidential is refused at submission, and so is a training run
// whose model is (by the aggregator's admission, with SC4002 for the
// silos' confidential data); the same job unclassed is admitted.
func TestConfidentialRefusedOnOpenPool(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process admission test")
	}
	c := newCluster(t, "open", 1, member{"alice", "researcher"}, member{"h1", "silo"}, member{"h2", "silo"}, member{"h3", "silo"})
	c.startAggregators()
	c.write("secret.yaml", "name: secret\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 2000, chunks: 2}}\nreducer: {use: mean, params: {weight: samples}}\nclasses: {content: confidential}\n")
	c.refused("alice", "SC4003", []string{`"the job's content" is confidential`}, "job", "submit", "secret.yaml")
	c.write("public.yaml", "name: public\nprogram: montecarlo-pi\npartitioner: {use: range, params: {count: 2000, chunks: 2}}\nreducer: {use: mean, params: {weight: samples}}\nclasses: {content: public, model: public}\n")
	c.mustCLI("alice", "job", "submit", "public.yaml")
	c.write("run.yaml", "name: secret-model\nstrategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}\nmodel: {kind: logistic, inputs: 9, class: confidential}\ndataset: patients\nrounds: 1\nprivacy: {clip: 5.0, sigma: 0.5}\nstandardize: none\nsecure_aggregation: true\n")
	c.refused("alice", "SC4003", []string{"the run's model", "SC4002"}, "fl", "launch", "run.yaml")
}
