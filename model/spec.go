package model

import "github.com/scellis/scellis/diag"

// Model kinds, the values of Spec.Kind.
const (
	KindLogistic = "logistic"
	KindSoftmax  = "softmax"
	KindLinear   = "linear"
	KindMLP      = "mlp"
	KindCNN      = "cnn"
)

// Spec describes a model's shape. Inputs is the number of features. Classes
// is 2 for logistic (0 means 2), the number of classes (≥ 2) for softmax,
// 1 for linear (0 means 1), and for mlp 1 (regression), 2 (binary) or the
// number of classes. Hidden is the mlp's hidden width and 0 otherwise.
//
// A cnn takes Classes as an mlp does; Image is its input's shape and Conv
// its convolution layers (see the package documentation), and Hidden the
// width of an optional dense tanh layer between the last pooled map and
// the output layer (0: none).
type Spec struct {
	Kind    string
	Inputs  int
	Classes int
	Hidden  int
	// Image is a cnn's input shape [height, width, channels], with
	// Inputs = height·width·channels: input (y·width + x)·channels + c is
	// channel c of the pixel in row y, column x (row-major, channels
	// last). Zero for the other kinds.
	Image [3]int
	// Conv lists the output channels of a cnn's convolution layers, in
	// order; each is a 3×3 convolution (stride 1, zero padding 1), ReLU,
	// then 2×2 max pooling (stride 2, an odd last row or column dropped).
	// Empty for the other kinds.
	Conv []int
}

// maxParams bounds a model's size so a typo cannot allocate the machine away.
const maxParams = 1 << 26

// head is the loss applied to the output layer.
type head int

const (
	headSigmoid  head = iota // one logit, binary log-loss
	headSoftmax              // K logits, categorical log-loss
	headIdentity             // one output, squared loss ½(ŷ−y)²
)

// layout is the resolved shape behind a Spec: an optional tanh hidden layer
// of width hidden, an affine output layer of width out, and a head. The
// offsets index the flat parameter vector (see the package documentation).
type layout struct {
	in, hidden, out int
	// conv are a cnn's convolution layers (nil for the other kinds), and
	// dense the width of the dense part's input: the last pooled map's
	// values for a cnn, in otherwise.
	conv           []convLayer
	dense          int
	classes        int // label values 0..classes-1 for classification, 0 for regression
	head           head
	w1, b1, w2, b2 int // offsets
	n              int // total number of parameters
}

// Validate reports whether s describes a model New can build.
func (s Spec) Validate() error {
	_, err := s.layout()
	return err
}

// NumParams returns the length of Params for a model of this Spec, or 0 if
// the Spec is invalid.
func (s Spec) NumParams() int {
	l, err := s.layout()
	if err != nil {
		return 0
	}
	return l.n
}

func (s Spec) layout() (layout, error) {
	bad := func(format string, args ...any) (layout, error) {
		return layout{}, diag.New(diag.InvalidValue, "model "+s.Kind, format, args...)
	}
	if s.Inputs < 1 {
		return bad("a model needs at least one input, got Inputs = %d", s.Inputs)
	}
	l := layout{in: s.Inputs}
	switch s.Kind {
	case KindLogistic:
		if s.Classes != 0 && s.Classes != 2 {
			return bad("logistic regression is binary: Classes must be 2, got %d", s.Classes)
		}
		l.out, l.classes, l.head = 1, 2, headSigmoid
	case KindSoftmax:
		if s.Classes < 2 {
			return bad("softmax regression needs Classes ≥ 2, got %d", s.Classes)
		}
		l.out, l.classes, l.head = s.Classes, s.Classes, headSoftmax
	case KindLinear:
		if s.Classes > 1 || s.Classes < 0 {
			return bad("linear regression has one output: Classes must be 0 or 1, got %d", s.Classes)
		}
		l.out, l.head = 1, headIdentity
	case KindMLP, KindCNN:
		if s.Kind == KindMLP && s.Hidden < 1 {
			return bad("an mlp needs Hidden ≥ 1, got %d", s.Hidden)
		}
		if s.Hidden < 0 {
			return bad("a cnn's dense layer needs Hidden ≥ 0 (0: none), got %d", s.Hidden)
		}
		l.hidden = s.Hidden
		switch {
		case s.Classes == 1:
			l.out, l.head = 1, headIdentity
		case s.Classes == 2:
			l.out, l.classes, l.head = 1, 2, headSigmoid
		case s.Classes > 2:
			l.out, l.classes, l.head = s.Classes, s.Classes, headSoftmax
		default:
			return bad("an %s needs Classes: 1 for regression, 2 for binary, K ≥ 3 for K classes; got %d", s.Kind, s.Classes)
		}
	default:
		return layout{}, diag.New(diag.InvalidValue, "model", "unknown model kind %q", s.Kind).
			WithHelp("use one of %q, %q, %q, %q, %q", KindLogistic, KindSoftmax, KindLinear, KindMLP, KindCNN)
	}
	if s.Kind != KindMLP && s.Kind != KindCNN && s.Hidden != 0 {
		return bad("only an mlp or a cnn has a hidden layer: Hidden must be 0, got %d", s.Hidden)
	}
	l.dense = l.in
	n := 0.0
	if s.Kind == KindCNN {
		convs, dense, params, err := s.convLayers()
		if err != nil {
			return layout{}, err
		}
		l.conv, l.dense, n = convs, dense, params
	} else if s.Image != [3]int{} || len(s.Conv) > 0 {
		return bad("only a cnn has an image shape and convolution layers")
	}
	feed := l.dense
	if l.hidden > 0 {
		n += float64(float64(l.hidden)*float64(l.dense)) + float64(l.hidden)
		feed = l.hidden
	}
	n += float64(float64(l.out)*float64(feed)) + float64(l.out)
	if n > maxParams {
		return bad("the model would have %.0f parameters, more than the limit of %d", n, maxParams)
	}
	end := 0
	if k := len(l.conv); k > 0 {
		end = l.conv[k-1].bOff + l.conv[k-1].cout
	}
	l.w1, l.w2 = end, end
	if l.hidden > 0 {
		l.b1 = l.w1 + l.hidden*l.dense
		l.w2 = l.b1 + l.hidden
	}
	l.b2 = l.w2 + l.out*feed
	l.n = l.b2 + l.out
	return l, nil
}

// feed is the width of the output layer's input.
func (l layout) feed() int {
	if l.hidden > 0 {
		return l.hidden
	}
	return l.dense
}

// eachBlock calls fn on the parameter blocks in order, [lo, hi) with
// mask 1 for weights and 0 for biases: L2 and weight decay apply to
// weights only, never to intercepts. A mask per block, not a vector of
// masks as long as the model (8 bytes a parameter).
func (l layout) eachBlock(fn func(lo, hi int, mask float64)) {
	for _, c := range l.conv {
		fn(c.wOff, c.bOff, 1)
		fn(c.bOff, c.bOff+c.cout, 0)
	}
	if l.hidden > 0 {
		fn(l.w1, l.b1, 1)
		fn(l.b1, l.w2, 0)
	}
	fn(l.w2, l.b2, 1)
	fn(l.b2, l.n, 0)
}

// weightMask is eachBlock's masks as a vector.
func (l layout) weightMask() []float64 {
	m := make([]float64, l.n)
	l.eachBlock(func(lo, hi int, mask float64) {
		for i := lo; i < hi; i++ {
			m[i] = mask
		}
	})
	return m
}

// ParamLayout says where each block of a model's flat parameter vector
// lies (offsets into Params, lengths in values), for readers outside Go:
// for a cnn first ConvWeights and ConvBias, one pair per convolution layer
// (weights Cout×(3·3·Cin), row-major, row o = output channel o, column
// (ky·3 + kx)·Cin + c = kernel row ky, column kx, input channel c);
// HiddenWeights (H×d, row-major; d the inputs, for a cnn the last pooled
// map's values in (y, x, channel) order) and HiddenBias (H) for an mlp or
// a cnn with a dense layer, then Weights (O×feed, row-major, one row per
// output) and Bias (O).
type ParamLayout struct {
	ConvWeights   [][2]int `json:"conv_weights,omitempty"`
	ConvBias      [][2]int `json:"conv_bias,omitempty"`
	HiddenWeights [2]int   `json:"hidden_weights,omitzero"`
	HiddenBias    [2]int   `json:"hidden_bias,omitzero"`
	Weights       [2]int   `json:"weights"`
	Bias          [2]int   `json:"bias"`
	Outputs       int      `json:"outputs"`
	Params        int      `json:"params"`
}

// Layout returns s's parameter layout, as [offset, length] pairs.
func (s Spec) Layout() (ParamLayout, error) {
	l, err := s.layout()
	if err != nil {
		return ParamLayout{}, err
	}
	p := ParamLayout{Weights: [2]int{l.w2, l.b2 - l.w2}, Bias: [2]int{l.b2, l.out}, Outputs: l.out, Params: l.n}
	for _, c := range l.conv {
		p.ConvWeights = append(p.ConvWeights, [2]int{c.wOff, c.bOff - c.wOff})
		p.ConvBias = append(p.ConvBias, [2]int{c.bOff, c.cout})
	}
	if l.hidden > 0 {
		p.HiddenWeights = [2]int{l.w1, l.b1 - l.w1}
		p.HiddenBias = [2]int{l.b1, l.hidden}
	}
	return p, nil
}

// ClassCount returns the number of label classes of s (0 for regression).
func (s Spec) ClassCount() int {
	l, err := s.layout()
	if err != nil {
		return 0
	}
	return l.classes
}
