package trainer

import (
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// ReadONNX refuses what is not an ONNX model (garbage, truncation, a
// protobuf without a graph, a tensor of the wrong size, external data)
// without panicking, and reads a minimal one's initializers;
// CheckWeights finds a weight that differs.
func TestReadONNX(t *testing.T) {
	tensor := func(name string, dims []int, vals []float32, extra ...byte) []byte {
		var b []byte
		for _, d := range dims {
			b = protowire.AppendTag(b, tensorDims, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(d))
		}
		b = protowire.AppendTag(b, tensorType, protowire.VarintType)
		b = protowire.AppendVarint(b, onnxFloat)
		b = protowire.AppendTag(b, tensorName, protowire.BytesType)
		b = protowire.AppendString(b, name)
		var raw []byte
		for _, v := range vals {
			raw = protowire.AppendFixed32(raw, math.Float32bits(v))
		}
		b = protowire.AppendTag(b, tensorRawData, protowire.BytesType)
		b = protowire.AppendBytes(b, raw)
		return append(b, extra...)
	}
	model := func(tensors ...[]byte) []byte {
		var g []byte
		g = protowire.AppendTag(g, graphNode, protowire.BytesType)
		g = protowire.AppendBytes(g, []byte{})
		for _, tn := range tensors {
			g = protowire.AppendTag(g, graphInitializer, protowire.BytesType)
			g = protowire.AppendBytes(g, tn)
		}
		var m []byte
		m = protowire.AppendTag(m, modelIRVersion, protowire.VarintType)
		m = protowire.AppendVarint(m, 7)
		m = protowire.AppendTag(m, modelGraph, protowire.BytesType)
		m = protowire.AppendBytes(m, g)
		m = protowire.AppendTag(m, modelOpset, protowire.BytesType)
		m = protowire.AppendBytes(m, []byte{})
		return m
	}
	good := model(tensor("a", []int{2}, []float32{1, 2}), tensor("b", []int{1}, []float32{3}))
	m, err := ReadONNX(good)
	if err != nil || m.IRVersion != 7 || m.Nodes != 1 || len(m.Initializers) != 2 || m.Initializers["a"][1] != 2 {
		t.Fatalf("ReadONNX: %v %+v", err, m)
	}
	layout := Layout{{Name: "a", Shape: []int{2}}, {Name: "b", Shape: []int{1}}, {Name: "c", Shape: []int{1}}}
	if n, err := m.CheckWeights([]float64{1, 2, 3, 9}, layout); err != nil || n != 2 {
		t.Fatalf("CheckWeights of the same weights: %d %v", n, err)
	}
	if _, err := m.CheckWeights([]float64{1, 2.5, 3, 9}, layout); err == nil {
		t.Fatal("CheckWeights took a differing weight")
	}
	if _, err := m.CheckWeights([]float64{1}, Layout{{Name: "z", Shape: []int{1}}}); err == nil {
		t.Fatal("CheckWeights took a file holding none of the model's tensors")
	}
	external := protowire.AppendVarint(protowire.AppendTag(nil, tensorLocation, protowire.VarintType), 1)
	for name, raw := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not a protobuf \xff\xff\xff\xff"),
		"truncated": good[:len(good)-3],
		"no graph":  protowire.AppendVarint(protowire.AppendTag(nil, modelIRVersion, protowire.VarintType), 7),
		"short":     model(tensor("a", []int{3}, []float32{1, 2})),
		"external":  model(tensor("a", []int{1}, []float32{1}, external...)),
	} {
		if _, err := ReadONNX(raw); err == nil {
			t.Errorf("ReadONNX took %s", name)
		}
	}
}
