package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/trainer"
)

// checkONNXWeights checks an exported ONNX file against the weights it
// was exported from (a trainer run's model file, or an .npy of the
// trainer in trainerDir): an ONNX model with nodes whose every tensor
// named as the model's holds those weights (to float32).
func checkONNXWeights(t *testing.T, onnxPath, weightsPath, trainerDir string) {
	t.Helper()
	raw, err := os.ReadFile(onnxPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := trainer.ReadONNX(raw)
	if err != nil {
		t.Fatalf("%s: %v", onnxPath, err)
	}
	var w []float64
	if strings.HasSuffix(weightsPath, ".json") {
		mf, err := fl.ReadModelFile(weightsPath)
		if err != nil {
			t.Fatal(err)
		}
		w = mf.Params
	} else {
		b, err := os.ReadFile(weightsPath)
		if err != nil {
			t.Fatal(err)
		}
		if w, _, err = trainer.DecodeNPY(b); err != nil {
			t.Fatal(err)
		}
	}
	lraw, err := os.ReadFile(filepath.Join(trainerDir, trainer.LayoutFile))
	if err != nil {
		t.Fatal(err)
	}
	layout, err := trainer.ParseLayout(lraw)
	if err != nil {
		t.Fatal(err)
	}
	if m.IRVersion <= 0 || m.Nodes == 0 || len(w) != layout.Size() {
		t.Fatalf("%s: IR %d, %d nodes; %d weights for a layout of %d", onnxPath, m.IRVersion, m.Nodes, len(w), layout.Size())
	}
	off := 0
	for _, tn := range layout {
		got, ok := m.Initializers[tn.Name]
		if !ok || len(got) != tn.Size() {
			t.Fatalf("%s has no tensor %s of %d values (it has %d)", onnxPath, tn.Name, tn.Size(), len(got))
		}
		for i, v := range got {
			if float32(v) != float32(w[off+i]) {
				t.Fatalf("%s: %s[%d] is %g; the weights say %g", onnxPath, tn.Name, i, v, w[off+i])
			}
		}
		off += tn.Size()
	}
}

// scellis trainer export writes a trainer's model as ONNX in the sandbox:
// the walkthrough's CNN, trained once, exports through its example_input
// (torch.onnx.export, no onnx package) into a file whose tensors hold the
// trained weights. A trainer whose export writes other weights than it was
// given is refused (SC9507), and a trainer that provides no export
// (numpy) says so (SC9512); both exit 2 and write nothing. And scellis
// model predict applies a trainer run's model through the trainer.
func TestTrainerExportONNX(t *testing.T) {
	t.Parallel()
	needTorch(t)
	dir := t.TempDir()
	mustRun(t, scellisCmd(t, dir, "datagen", "glyphs", "--sites", "1", "--rows", "300", "--test", "100", "--out", "data"))
	src, err := os.ReadFile("../../examples/trainer-cnn/train.py")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) { writeFileIn(t, dir, name, body) }
	write("cnn/train.py", string(src))
	call := "if __name__ == \"__main__\":\n    st.main(build_model, load_data, train, evaluate, example_input=example_input)"
	if !strings.Contains(string(src), call) {
		t.Fatalf("examples/trainer-cnn/train.py does not end with %s", call)
	}
	// A trainer whose export moves a weight before writing the file.
	write("liar/train.py", strings.Replace(string(src), call, `def lying_export(model, path, params):
    with torch.no_grad():
        model.fc.bias.add_(1.0)
    st.torch_export_onnx(model, example_input(params), path)


if __name__ == "__main__":
    st.main(build_model, load_data, train, evaluate, export=lying_export)`, 1))
	numpySrc, err := os.ReadFile("../../trainer/testdata/numpy/train.py")
	if err != nil {
		t.Fatal(err)
	}
	write("tiny/train.py", string(numpySrc))
	for _, tr := range []string{"cnn", "liar", "tiny"} {
		mustRun(t, scellisCmd(t, dir, "trainer", "init", tr))
	}
	mustRun(t, scellisCmd(t, dir, "trainer", "train", "cnn", "--data", "data/site-1.csv", "--param", "epochs=4", "--param", "lr=0.03", "--param", "momentum=0.9", "--out", "w.npy"))
	var rep struct {
		Bytes   int `json:"bytes"`
		Checked int `json:"tensors_checked"`
		Tensors int `json:"tensors"`
	}
	out := mustRun(t, scellisCmd(t, dir, "--json", "trainer", "export", "cnn", "--weights", "w.npy", "--out", "cnn.onnx"))
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Checked != 6 || rep.Tensors != 6 || rep.Bytes < 2650*4 {
		t.Fatalf("trainer export: %v %+v\n%s", err, rep, out)
	}
	checkONNXWeights(t, filepath.Join(dir, "cnn.onnx"), filepath.Join(dir, "w.npy"), filepath.Join(dir, "cnn"))

	refused := func(code, tr, weights string) {
		t.Helper()
		out, err := scellisCmd(t, dir, "trainer", "export", tr, "--weights", weights, "--out", tr+".onnx").CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), code) {
			t.Fatalf("trainer export %s: want %s, exit 2; got %v\n%s", tr, code, err, out)
		}
		if _, err := os.Stat(filepath.Join(dir, tr+".onnx")); !os.IsNotExist(err) {
			t.Fatalf("trainer export %s wrote %s.onnx: %v", tr, tr, err)
		}
	}
	refused("SC9507", "liar", "liar/init.npy")
	refused("SC9512", "tiny", "tiny/init.npy")

	// scellis model predict on a trainer run's model file (here one
	// written by hand from the trained weights: kind trainer, the
	// trainer's hash, no signature) runs the trainer's predict in the
	// sandbox on rows without a label column: one prediction per row, in
	// the file's order — their accuracy on the held-back labels is
	// exactly what the trainer's evaluate counts on the same rows.
	var check struct {
		Hash content.Ref `json:"hash"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, scellisCmd(t, dir, "--json", "trainer", "check", "cnn"))), &check); err != nil {
		t.Fatal(err)
	}
	wraw, err := os.ReadFile(filepath.Join(dir, "w.npy"))
	if err != nil {
		t.Fatal(err)
	}
	w, _, err := trainer.DecodeNPY(wraw)
	if err != nil {
		t.Fatal(err)
	}
	mf, err := json.Marshal(fl.ModelFile{Format: fl.ModelFileFormat, Kind: fl.KindTrainer, Trainer: check.Hash, Params: w})
	if err != nil {
		t.Fatal(err)
	}
	write("model.json", string(mf))
	test, err := os.ReadFile(filepath.Join(dir, "data", "test.csv"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(bytes.NewReader(test)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	li := slices.Index(recs[0], "label")
	var features bytes.Buffer
	cw := csv.NewWriter(&features)
	for _, r := range recs {
		cw.Write(slices.Delete(slices.Clone(r), li, li+1))
	}
	cw.Flush()
	write("features.csv", features.String())
	mustRun(t, scellisCmd(t, dir, "model", "predict", "model.json", "--trainer", "cnn", "--data", "features.csv", "--out", "preds.csv"))
	praw, err := os.ReadFile(filepath.Join(dir, "preds.csv"))
	if err != nil {
		t.Fatal(err)
	}
	preds, err := csv.NewReader(bytes.NewReader(praw)).ReadAll()
	if err != nil || len(preds) != len(recs) || len(preds[0]) != 11 || preds[0][0] != "prediction" || preds[0][10] != "p_9" {
		t.Fatalf("preds.csv: %v, %d rows for %d, header %v", err, len(preds), len(recs), preds[0])
	}
	correct := 0
	for i, p := range preds[1:] {
		if p[0] == recs[i+1][li] {
			correct++
		}
	}
	predicted := float64(correct) / float64(len(preds)-1)
	if evaluated := trainerAccuracy(t, dir, "cnn", "--model", "model.json", "data/test.csv"); predicted != evaluated {
		t.Fatalf("model predict's predictions are %.4f accurate on test.csv; the trainer's evaluate says %.4f", predicted, evaluated)
	}
	t.Logf("model predict: %d rows, accuracy %.4f, as the trainer's evaluate", len(preds)-1, predicted)
	for _, args := range [][]string{
		{"model", "predict", "model.json", "--data", "features.csv", "--out", "p2.csv"},                      // no trainer
		{"model", "predict", "model.json", "--trainer", "liar", "--data", "features.csv", "--out", "p2.csv"}, // another trainer
	} {
		out, err := scellisCmd(t, dir, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "SC9401") {
			t.Fatalf("scellis %s: want SC9401, exit 2; got %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
