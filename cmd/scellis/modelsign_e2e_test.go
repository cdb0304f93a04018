package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
)

// A model file is assembled and signed by an aggregator node from its
// replica (GET /v1/runs/{id}/model), and model verify checks it: through
// real processes, a short run, fl model, then every byte of the file
// flipped three ways (checked with the parser model verify runs) and a
// dense sample of those flips through the real binary — each flip that
// changes what a JSON reader sees is refused with exit 2 and a code —,
// edits of the history, the privacy charges and the parameters refused,
// and a file re-signed with a key that is not an aggregator's refused
// against the federation.
func TestFLModelSignedByTheCluster(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process federated run")
	}
	silos := []string{"h1", "h2", "h3"}
	ms := siloMembers(silos)
	c := newCluster(t, "own", 1, append(ms, member{"alice", "researcher"})...)
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "3", "--rows", "200", "--seed", "5", "--out", "data"))
	for i, s := range silos {
		c.writeSilo(hospitalSilo(s, i+1, 10, ""))
	}
	c.write("run.yaml", `name: signed
strategy: {use: fedavg, params: {lr: 0.5, epochs: 1}}
model: {kind: logistic, inputs: 9, label: outcome}
dataset: patients
rounds: 2
privacy: {dp: false}
standardize: local
seed: 4
`)
	c.startAggregators()
	for _, s := range silos {
		c.start(s, "silo", "--config", s+".yaml")
	}
	id := strings.TrimSpace(c.mustCLI("alice", "fl", "launch", "run.yaml"))
	if out, errs, err := c.cli("alice", "fl", "watch", id); err != nil || !strings.Contains(out, "run done") {
		t.Fatalf("fl watch: %v\n%s%s", err, out, errs)
	}
	if out := c.mustCLI("alice", "fl", "model", id, "--out", "model.json"); !strings.Contains(out, "signed by agg-1") {
		t.Fatalf("fl model does not say who signed:\n%s", out)
	}
	bin := scellisBinary(t)
	exit, out, errs := runBounded(t, bin, c.dir, "model", "verify", "model.json", "--federation", "federation.yaml")
	if exit != 0 || !strings.Contains(out, "signature valid: aggregator node agg-1") || !strings.Contains(out, "signer: an aggregator of federation.yaml") {
		t.Fatalf("model verify of the exported file: exit %d\n%s%s", exit, out, errs)
	}
	exit, out, errs = runBounded(t, bin, c.dir, "--json", "model", "verify", "model.json", "--federation", "federation.yaml")
	var verified modelVerification
	if err := json.Unmarshal([]byte(out), &verified); exit != 0 || err != nil || verified.Signer != "agg-1" || verified.Federation != "federation.yaml" || verified.Steps != 2 || verified.Run != id {
		t.Fatalf("model verify --json: exit %d, %v\n%s%s", exit, err, out, errs)
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	var orig map[string]any
	if err := json.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	if rounds, _ := orig["rounds"].([]any); len(rounds) != 2 {
		t.Fatalf("the file records %d steps, want 2", len(rounds))
	}

	flipEveryByte(t, c, bin, b, orig)

	// Edits of the history, the privacy charges and the parameters.
	edits := map[string]func(m map[string]any){
		"a step dropped": func(m map[string]any) { m["rounds"] = m["rounds"].([]any)[1:] },
		"a step's participants": func(m map[string]any) {
			r := m["rounds"].([]any)[0].(map[string]any)
			r["participants"] = r["participants"].([]any)[1:]
		},
		"a silo's ε":     func(m map[string]any) { m["privacy"].([]any)[0].(map[string]any)["epsilon_sum"] = 0.01 },
		"a parameter":    func(m map[string]any) { m["params"].([]any)[0] = 1.5 },
		"the run's name": func(m map[string]any) { m["run"].(map[string]any)["name"] = "other" },
		"a receipt ref":  func(m map[string]any) { m["refs"].(map[string]any)["receipts"] = []any{} },
	}
	for what, edit := range edits {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		edit(m)
		e, _ := json.MarshalIndent(m, "", "  ")
		c.write("edited.json", string(e))
		exit, out, errs := runBounded(t, bin, c.dir, "model", "verify", "edited.json", "--federation", "federation.yaml")
		if exit != 2 || !strings.Contains(errs, "SC9406") {
			t.Fatalf("%s edited: model verify exit %d, want 2 with SC9406\n%s%s", what, exit, out, errs)
		}
	}

	// The same edit signed again with a silo's key, in its name or in the
	// aggregator's: the signature holds, the signer is no aggregator.
	h1, _, err := identity.Load(filepath.Join(c.dir, "h1", "identity.key"), identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mf, err := fl.ParseModelFile(b, "model.json")
	if err != nil {
		t.Fatal(err)
	}
	mf.Privacy[0].EpsilonSum = 0.01
	for _, as := range []string{"h1", "agg-1", "mallory"} {
		forged, err := mf.Sign(h1, as)
		if err != nil {
			t.Fatal(err)
		}
		c.write("forged.json", string(forged))
		if exit, out, errs := runBounded(t, bin, c.dir, "model", "verify", "forged.json"); exit != 0 || !strings.Contains(out, "not checked against a federation") {
			t.Fatalf("a file signed by %s's key as %s, no federation given: exit %d\n%s%s", "h1", as, exit, out, errs)
		}
		if exit, out, errs := runBounded(t, bin, c.dir, "model", "verify", "forged.json", "--federation", "federation.yaml"); exit != 2 || !strings.Contains(errs, "SC9408") {
			t.Fatalf("a file signed by h1's key as %s: model verify exit %d, want 2 with SC9408\n%s%s", as, exit, out, errs)
		}
	}
	// The signed file is a model file like any: model eval reads it.
	if out := mustRun(t, scellisCmd(t, c.dir, "model", "eval", "model.json", "--data", "data/hospital-1.csv")); !strings.Contains(out, "accuracy") {
		t.Fatalf("model eval of the signed file:\n%s", out)
	}
}

// flipEveryByte flips every byte of the model file b three ways and
// checks each flip with the parser model verify runs: refused, or the
// decoded JSON unchanged (a float's 17th digit that parses to the same
// value). A dense sample of the refused flips goes through the binary:
// exit 2 with a model-file code.
func flipEveryByte(t *testing.T, c *cluster, bin string, b []byte, orig map[string]any) {
	type flip struct {
		at   int
		mask byte
	}
	var refused []flip
	unchanged := 0
	for i := range b {
		for _, mask := range []byte{0x01, 0x20, 0x80} {
			f := append([]byte(nil), b...)
			f[i] ^= mask
			if _, err := fl.ParseModelFile(f, "flipped"); err != nil {
				refused = append(refused, flip{i, mask})
				continue
			}
			var now map[string]any
			if json.Unmarshal(f, &now) != nil || !reflect.DeepEqual(now, orig) {
				t.Fatalf("byte %d ^ %#x (%q → %q) changes the file's content and is accepted", i, mask, b[i], f[i])
			}
			unchanged++
		}
	}
	t.Logf("%d bytes: %d flips refused, %d left the decoded JSON as it was", len(b), len(refused), unchanged)
	// A dense sample of the refused flips through the binary: exit 2
	// with a model-file code, never accepted.
	stride := max(1, len(refused)/120)
	for k := 0; k < len(refused); k += stride {
		fp := refused[k]
		f := append([]byte(nil), b...)
		f[fp.at] ^= fp.mask
		c.write("flipped.json", string(f))
		exit, out, errs := runBounded(t, bin, c.dir, "model", "verify", "flipped.json", "--federation", "federation.yaml")
		if exit != 2 || !(strings.Contains(errs, "SC9406") || strings.Contains(errs, "SC9401") || strings.Contains(errs, "SC9402")) {
			t.Fatalf("byte %d ^ %#x (%q → %q): model verify exit %d, want 2 with SC9406/SC9401/SC9402\n%s%s", fp.at, fp.mask, b[fp.at], f[fp.at], exit, out, errs)
		}
	}

}
