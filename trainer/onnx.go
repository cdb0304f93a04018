package trainer

import (
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// ONNXFile is the file a trainer's export mode writes in io/out.
const ONNXFile = "model.onnx"

// ONNXModel is what Scellis reads of an ONNX file (a serialised
// ModelProto, onnx.proto): enough to know it is one and to check that it
// carries the model's weights. Nothing runs it.
type ONNXModel struct {
	IRVersion int64
	Producer  string
	Opsets    int
	Nodes     int
	// Initializers are the graph's constant tensors held in the file,
	// float or double, by name (others are left out).
	Initializers map[string][]float64
}

// ONNX field numbers (onnx.proto).
const (
	modelIRVersion   = 1
	modelProducer    = 2
	modelGraph       = 7
	modelOpset       = 8
	graphNode        = 1
	graphInitializer = 5
	tensorDims       = 1
	tensorType       = 2
	tensorFloatData  = 4
	tensorName       = 8
	tensorRawData    = 9
	tensorDoubleData = 10
	tensorLocation   = 14
	onnxFloat        = 1
	onnxDouble       = 11
)

// fields walks one protobuf message, calling f for each field with its
// number, wire type and value (the varint, or the bytes of a length-
// delimited or fixed field).
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, raw []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var raw []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			raw, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, raw); err != nil {
			return err
		}
	}
	return nil
}

// ReadONNX parses an ONNX model file. It refuses what is not one: no IR
// version, no graph, no operator set, a tensor stored outside the file.
func ReadONNX(raw []byte) (*ONNXModel, error) {
	m := &ONNXModel{Initializers: map[string][]float64{}}
	var graph []byte
	err := fields(raw, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case num == modelIRVersion && typ == protowire.VarintType:
			m.IRVersion = int64(v)
		case num == modelProducer && typ == protowire.BytesType:
			m.Producer = string(b)
		case num == modelGraph && typ == protowire.BytesType:
			graph = b
		case num == modelOpset && typ == protowire.BytesType:
			m.Opsets++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("not an ONNX model (protobuf): %w", err)
	}
	if m.IRVersion <= 0 || graph == nil || m.Opsets == 0 {
		return nil, fmt.Errorf("not an ONNX model: IR version %d, graph %v, %d operator sets", m.IRVersion, graph != nil, m.Opsets)
	}
	err = fields(graph, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case num == graphNode && typ == protowire.BytesType:
			m.Nodes++
		case num == graphInitializer && typ == protowire.BytesType:
			name, vals, err := readTensor(b)
			if err != nil {
				return err
			}
			if vals != nil {
				m.Initializers[name] = vals
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("the ONNX graph: %w", err)
	}
	if m.Nodes == 0 {
		return nil, fmt.Errorf("the ONNX graph has no nodes")
	}
	return m, nil
}

// readTensor reads a TensorProto's name and, for float and double
// tensors, its values (nil for other types).
func readTensor(b []byte) (string, []float64, error) {
	var name string
	var dtype uint64
	var rawData []byte
	var vals []float64
	count := 1
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, raw []byte) error {
		switch num {
		case tensorName:
			name = string(raw)
		case tensorType:
			dtype = v
		case tensorLocation:
			if v != 0 {
				return fmt.Errorf("a tensor is stored outside the file (external data)")
			}
		case tensorDims:
			if typ == protowire.BytesType { // packed
				for len(raw) > 0 {
					d, n := protowire.ConsumeVarint(raw)
					if n < 0 {
						return protowire.ParseError(n)
					}
					count *= int(d)
					raw = raw[n:]
				}
			} else {
				count *= int(v)
			}
		case tensorRawData:
			rawData = raw
		case tensorFloatData:
			if typ == protowire.BytesType {
				for i := 0; i+4 <= len(raw); i += 4 {
					vals = append(vals, float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))))
				}
			} else {
				vals = append(vals, float64(math.Float32frombits(uint32(v))))
			}
		case tensorDoubleData:
			if typ == protowire.BytesType {
				for i := 0; i+8 <= len(raw); i += 8 {
					vals = append(vals, math.Float64frombits(binary.LittleEndian.Uint64(raw[i:])))
				}
			} else {
				vals = append(vals, math.Float64frombits(v))
			}
		}
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	switch {
	case dtype == onnxFloat && rawData != nil:
		vals = make([]float64, 0, len(rawData)/4)
		for i := 0; i+4 <= len(rawData); i += 4 {
			vals = append(vals, float64(math.Float32frombits(binary.LittleEndian.Uint32(rawData[i:]))))
		}
	case dtype == onnxDouble && rawData != nil:
		vals = make([]float64, 0, len(rawData)/8)
		for i := 0; i+8 <= len(rawData); i += 8 {
			vals = append(vals, math.Float64frombits(binary.LittleEndian.Uint64(rawData[i:])))
		}
	case dtype != onnxFloat && dtype != onnxDouble:
		return name, nil, nil
	}
	if len(vals) != count {
		return "", nil, fmt.Errorf("tensor %q holds %d values for %d elements", name, len(vals), count)
	}
	return name, vals, nil
}

// CheckWeights checks that the file carries the model: every initializer
// named as one of the layout's tensors holds that tensor's weights (to
// float32 precision when stored as float), and at least one does. It
// returns how many of the layout's tensors it checked.
func (m *ONNXModel) CheckWeights(w []float64, layout Layout) (int, error) {
	if len(w) != layout.Size() {
		return 0, fmt.Errorf("%d weights for a layout of %d", len(w), layout.Size())
	}
	checked, off := 0, 0
	for _, t := range layout {
		n := t.Size()
		got, ok := m.Initializers[t.Name]
		want := w[off : off+n]
		off += n
		if !ok {
			continue
		}
		if len(got) != n {
			return checked, fmt.Errorf("tensor %q has %d values in the ONNX file, %d in the model", t.Name, len(got), n)
		}
		for i := range want {
			if got[i] != want[i] && float32(got[i]) != float32(want[i]) {
				return checked, fmt.Errorf("tensor %q differs from the model's at %d: %g, not %g", t.Name, i, got[i], want[i])
			}
		}
		checked++
	}
	if checked == 0 {
		return 0, fmt.Errorf("none of the model's %d tensors is in the ONNX file by name", len(layout))
	}
	return checked, nil
}
