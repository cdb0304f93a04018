package fl

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

const cnnRun = `name: cnn-glyphs
strategy: {use: fedavg, params: {lr: 0.05, epochs: 2}}
model:
  kind: cnn
  inputs: 256
  classes: 10
  image: [16, 16, 1]
  conv: [8, 16]
  hidden: 64
dataset: glyphs
rounds: 3
standardize: none
privacy: {clip: 5.0, sigma: 0.01}
`

// A cnn's run spec reaches the model the silos and aggregators build (the
// strategy params, the default init, the model file) with its image and
// convolution layers; [height, width] means one channel.
func TestRunSpecCNN(t *testing.T) {
	want := model.Spec{Kind: model.KindCNN, Inputs: 256, Classes: 10, Hidden: 64, Image: [3]int{16, 16, 1}, Conv: []int{8, 16}}
	cat, _ := catalog.Builtin()
	for _, src := range []string{cnnRun, strings.Replace(cnnRun, "[16, 16, 1]", "[16, 16]", 1)} {
		s, err := ParseRunSpec("run.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		canon, _, st, err := s.Resolve(cat, ".")
		if err != nil {
			t.Fatal(err)
		}
		got := canon.ModelSpec()
		if got.Kind != want.Kind || got.Inputs != want.Inputs || got.Classes != want.Classes || got.Hidden != want.Hidden ||
			got.Image != want.Image || !slices.Equal(got.Conv, want.Conv) {
			t.Fatalf("the run's model is %+v, want %+v", got, want)
		}
		if canon.NumParams() != want.NumParams() {
			t.Fatalf("%d parameters, want %d", canon.NumParams(), want.NumParams())
		}
		// The aggregator's default init builds the same model.
		g, err := defaultInit(st.With(canon.Params()), 256)
		if err != nil {
			t.Fatal(err)
		}
		w, _ := g.Vector("w")
		m, _ := model.New(want, 0)
		if !slices.Equal(w, m.Params) {
			t.Fatal("the default init is not model.New's cnn")
		}
		// The model file carries the shape, and reads back as the same model.
		f, err := NewModelFile(canon, g, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseModelFile(b, "model.json")
		if err != nil {
			t.Fatal(err)
		}
		if bs := back.Spec(); bs.Image != want.Image || !slices.Equal(bs.Conv, want.Conv) || bs.NumParams() != want.NumParams() || len(back.Layout.ConvWeights) != 2 {
			t.Fatalf("the model file's spec is %+v (layout %+v)", bs, back.Layout)
		}
	}
}

// A cnn's fields are refused where they are wrong, with the line and a
// stable code: no arbitrary caps, only shapes that cannot be built.
func TestRunSpecCNNRefused(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		code           diag.Code
		line           string
	}{
		{"no image", "  image: [16, 16, 1]\n", "", diag.MissingField, "run.yaml:4:"},
		{"no classes", "  classes: 10\n", "", diag.MissingField, "run.yaml:4:"},
		{"image of 4 values", "[16, 16, 1]", "[16, 16, 1, 1]", diag.InvalidValue, "run.yaml:7:"},
		{"image not the inputs", "[16, 16, 1]", "[16, 8, 1]", diag.InvalidValue, "run.yaml:7:"},
		{"zero side", "[16, 16, 1]", "[0, 16, 1]", diag.InvalidValue, "run.yaml:7:"},
		{"empty conv", "conv: [8, 16]", "conv: []", diag.InvalidValue, "run.yaml:8:"},
		{"zero channels", "conv: [8, 16]", "conv: [8, 0]", diag.InvalidValue, "run.yaml:8:"},
		{"pooled below 1x1", "conv: [8, 16]", "conv: [8, 8, 8, 8, 8]", diag.InvalidValue, "run.yaml:7:"},
		{"conv on an mlp", "kind: cnn", "kind: mlp", diag.InvalidValue, "run.yaml:7:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(cnnRun, tc.from, tc.to, 1)
			_, err := ParseRunSpec("run.yaml", []byte(src))
			ds, ok := diag.As(err)
			if !ok || ds[0].Code != tc.code || !strings.Contains(err.Error(), tc.line) || ds[0].Help == "" {
				t.Fatalf("want %s at %s with help, got %v", tc.code, tc.line, err)
			}
		})
	}
}
