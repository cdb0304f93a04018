package fl

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// signedTestFile is a model file of a resolved run spec, with a history,
// signed by an aggregator key.
func signedTestFile(t *testing.T) (*ModelFile, []byte) {
	t.Helper()
	s, err := ParseRunSpec("run.yaml", []byte(goodRun))
	if err != nil {
		t.Fatal(err)
	}
	spec, id, _, err := s.Resolve(builtins(t), ".")
	if err != nil {
		t.Fatal(err)
	}
	w := make([]float64, 10)
	for i := range w {
		w[i] = float64(i)/7 - 0.5
	}
	f, err := NewModelFile(spec, Global{"w": w}, &Standardization{Mode: StandardizeFederated, Mean: make([]float64, 9), Std: []float64{1, 2, 3, 4, 5, 6, 7, 8, 9}, Rows: 400})
	if err != nil {
		t.Fatal(err)
	}
	f.Run = ModelRun{ID: id, Name: s.Name, State: "done", Spec: spec}
	f.Rounds = []RoundSummary{NewRoundSummary(0, StepStats, []string{"h1", "h2", "h3"}, []string{"h4"}, map[string]float64{"examples": 400}, content.Hash([]byte("m0"))),
		NewRoundSummary(1, StepTrain, []string{"h1", "h2", "h3"}, nil, map[string]float64{"examples": 400, "loss": 200.5, "correct": 301}, content.Hash([]byte("m1")))}
	f.Rounds[1].Epsilon = map[string]float64{"h1": 0.5, "h2": 0.5, "h3": 0.5}
	f.Privacy = []SiloCharges{{Silo: "h1", Rounds: 2, EpsilonSum: 1.25}, {Silo: "h2", Rounds: 2, EpsilonSum: 1.25}}
	f.Refs = ModelRefs{Run: id, Model: content.Hash([]byte("m1")), RoundResults: []content.Ref{content.Hash([]byte("r0"))}, RoundJobs: []content.Ref{}, Receipts: []content.Ref{content.Hash([]byte("rc"))}}
	b, err := f.Sign(identity.NewFromSeed([32]byte{7}), "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	return f, b
}

// A signed model file reads back; every single-byte change that alters
// what a JSON reader sees in it (its content, key names included) is
// refused: a bad signature (SC9406), or a file that no longer parses
// (SC9401, SC9402). The only changes read are those that leave the
// decoded JSON as it was.
func TestModelFileSignatureCoversEveryByte(t *testing.T) {
	_, b := signedTestFile(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "model.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := ReadModelFile(path)
	if err != nil {
		t.Fatalf("the signed file does not read back: %v", err)
	}
	if f.Attestation == nil || f.Attestation.Member != "agg-1" || !f.Attestation.Key.Equal(identity.NewFromSeed([32]byte{7}).Public()) {
		t.Fatalf("attestation %+v", f.Attestation)
	}
	var orig any
	if err := json.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	step := 1
	if testing.Short() {
		step = 7
	}
	refused, same := 0, 0
	for i := 0; i < len(b); i += step {
		for _, x := range []byte{0x01, 0x20, 0x80} {
			c := append([]byte(nil), b...)
			c[i] ^= x
			_, err := ParseModelFile(c, "flipped")
			var now any
			if err == nil {
				if json.Unmarshal(c, &now) == nil && reflect.DeepEqual(now, orig) {
					same++
					continue
				}
				t.Fatalf("byte %d ^ %#x (%q → %q) changes the file's JSON and was accepted", i, x, b[i], c[i])
			}
			if !hasCode(err, diag.ModelSignatureBad) && !hasCode(err, diag.ModelFileBad) && !hasCode(err, diag.ModelFormatUnknown) {
				t.Fatalf("byte %d ^ %#x refused without a model-file code: %v", i, x, err)
			}
			refused++
		}
	}
	t.Logf("%d flips refused, %d left the decoded JSON unchanged", refused, same)
	if refused == 0 {
		t.Fatal("no flip was refused")
	}
}

// Edits of the history are refused however the file is reformatted; the
// same edit with the signature made again by another key verifies as that
// key's (model verify --federation then refuses the signer).
func TestModelFileEditsRefused(t *testing.T) {
	_, b := signedTestFile(t)
	for name, edit := range map[string]func(f map[string]any){
		"rounds":  func(f map[string]any) { f["rounds"] = f["rounds"].([]any)[1:] },
		"privacy": func(f map[string]any) { f["privacy"].([]any)[0].(map[string]any)["epsilon_sum"] = 0.25 },
		"params":  func(f map[string]any) { f["params"].([]any)[0] = 0.0 },
		"signer":  func(f map[string]any) { f["attestation"].(map[string]any)["member"] = "agg-2" },
		"case":    func(f map[string]any) { f["Privacy"] = []any{} },
	} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		c, _ := json.Marshal(m) // compact: the whitespace differs too
		if _, err := ParseModelFile(c, name); !hasCode(err, diag.ModelSignatureBad) {
			t.Errorf("an edit of %s: %v, want SC9406", name, err)
		}
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	c, _ := json.Marshal(m)
	if _, err := ParseModelFile(c, "compact"); err != nil {
		t.Fatalf("the same content, compact, is refused: %v", err)
	}
	if !strings.Contains(string(b), `"format": "`+ModelFileFormat+`"`) {
		t.Fatalf("the file does not say its format:\n%s", b)
	}
}

// hasCode reports whether err is a diagnostic list holding code c.
func hasCode(err error, c diag.Code) bool {
	ds, ok := diag.As(err)
	return ok && slices.ContainsFunc(ds, func(d *diag.Diagnostic) bool { return d.Code == c })
}
