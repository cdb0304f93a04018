package datagen

import (
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/model"
)

// The built-in cnn earns its size centrally (docs/models.md, "A
// convolutional network"): trained on the four glyph sites' 1,200 images
// pooled, it scores the 1,000 held-out images far better than an mlp of
// at least as many parameters trained the same way — the same epochs,
// batch, learning rate and seed. TestFLCNNBeatsMLP (cmd/scellis) shows
// the same live, through silos. Measured: cnn 0.90, mlp 0.59 after three
// epochs (after ten: 0.90 and 0.83).
func TestCNNBeatsMLPCentrally(t *testing.T) {
	sites, test, err := Glyphs(4, 300, 1000, 0.5, 3)
	if err != nil {
		t.Fatal(err)
	}
	var data []float64
	var labels []float64
	for _, s := range sites {
		raw := s.Data.X.RawMatrix()
		data = append(data, raw.Data[:s.Data.Rows()*GlyphPixels]...)
		labels = append(labels, s.Data.Y...)
	}
	pooled := &model.Dataset{Name: "glyphs", Features: sites[0].Data.Features, Label: GlyphLabel,
		X: mat.NewDense(len(labels), GlyphPixels, data), Y: labels}
	cnn := model.Spec{Kind: model.KindCNN, Inputs: GlyphPixels, Classes: GlyphClasses, Hidden: 512,
		Image: [3]int{GlyphSide, GlyphSide, 1}, Conv: []int{8, 16}}
	mlp := model.Spec{Kind: model.KindMLP, Inputs: GlyphPixels, Classes: GlyphClasses, Hidden: 517}
	if cnn.NumParams() != 137_962 || mlp.NumParams() < cnn.NumParams() {
		t.Fatalf("cnn %d parameters, mlp %d", cnn.NumParams(), mlp.NumParams())
	}
	acc := map[string]float64{}
	for _, spec := range []model.Spec{cnn, mlp} {
		m, err := model.New(spec, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := model.Train(m, pooled, model.TrainConfig{Epochs: 3, BatchSize: 32, LR: 0.05, Seed: 1}); err != nil {
			t.Fatal(err)
		}
		acc[spec.Kind] = model.Evaluate(m, test.Data).Accuracy
	}
	t.Logf("held-out accuracy: cnn %.3f (%d parameters), mlp %.3f (%d parameters)", acc["cnn"], cnn.NumParams(), acc["mlp"], mlp.NumParams())
	if acc["cnn"] < 0.8 || acc["cnn"] < acc["mlp"]+0.15 {
		t.Fatalf("the cnn scored %.3f, the mlp %.3f: want the cnn at 0.8 or more and 0.15 above the mlp", acc["cnn"], acc["mlp"])
	}
}
