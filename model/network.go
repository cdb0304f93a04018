package model

import (
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/scellis/scellis/internal/repmath"
)

// workspace holds every buffer one forward/backward pass needs for up to
// cap rows, so the training loop allocates nothing per step or per example.
// A workspace belongs to one goroutine.
type workspace struct {
	l   layout
	cap int
	// scoring: the workspace only scores (forward passes): it holds no
	// gradient buffer (dh), which for an MLP is as large as h.
	scoring bool
	xb      []float64    // cap×in: gathered (and standardised) batch rows
	yb      []float64    // cap: their labels
	h       []float64    // cap×hidden: tanh activations
	dh      []float64    // cap×hidden: gradient w.r.t. the pre-activations
	z       []float64    // cap×out: outputs (logits), then ∂loss/∂output after the head
	cb      *convBuffers // a cnn's convolution layers (nil for the other kinds)
}

func newWorkspace(l layout, rows int) *workspace {
	ws := &workspace{l: l}
	ws.grow(max(rows, 1))
	return ws
}

// newScoringWorkspace is a workspace for forward passes only, of at
// most rows rows and fewer when a row's activations are wide: a scoring
// pass holds at most scoringBytes of them, or a few rows of a very wide
// MLP (scoringRows), not 256 rows of hidden units and their gradients (for
// an MLP of 10^6 parameters over nine inputs that was 372 bytes per
// parameter, the gradient buffer never used: issue 32).
func newScoringWorkspace(l layout, rows int) *workspace {
	ws := &workspace{l: l, scoring: true}
	ws.grow(scoringRows(l, rows))
	return ws
}

// scoringBytes bounds the activations one scoring pass holds.
const scoringBytes = 4 << 20

// scoringRows is how many of rows fit scoringBytes of activations: at
// least one, and for an MLP at least minScoringRows, since every block
// reads the whole hidden layer's weights (at d = 10^6, one row a block
// scored 5× slower than five; four rows of activations are about
// 4/(inputs+2) of a binary MLP's bytes: a third over nine inputs).
func scoringRows(l layout, rows int) int {
	perRow := 8 * (l.in + l.hidden + l.out + 1 + l.convRowFloats(true))
	least := 1
	if l.hidden > 0 || l.conv != nil {
		least = minScoringRows
	}
	return max(1, min(rows, max(least, scoringBytes/perRow)))
}

// minScoringRows is the fewest rows an MLP's scoring block holds.
const minScoringRows = 4

// grow makes room for at least rows rows.
func (ws *workspace) grow(rows int) {
	if rows <= ws.cap {
		return
	}
	l := ws.l
	ws.cap = rows
	ws.xb = make([]float64, rows*l.in)
	ws.yb = make([]float64, rows)
	ws.h = make([]float64, rows*l.hidden)
	if !ws.scoring {
		ws.dh = make([]float64, rows*l.hidden)
	}
	ws.z = make([]float64, rows*l.out)
	if l.conv != nil {
		ws.cb = newConvBuffers(l, rows, ws.scoring)
	}
}

// rowView is one example as a 1×len(x) matrix, without allocating.
func rowView(x []float64) blas64.General {
	return blas64.General{Rows: 1, Cols: len(x), Stride: len(x), Data: x}
}

// rowsView is rows [i, i+r) of a c-column row-major buffer.
func rowsView(data []float64, stride, i, r, c int) blas64.General {
	return blas64.General{Rows: r, Cols: c, Stride: stride, Data: data[i*stride:]}
}

func matrix(data []float64, r, c int) blas64.General {
	return blas64.General{Rows: r, Cols: c, Stride: c, Data: data[:r*c]}
}

// input returns the matrix feeding the output layer for the last forward
// pass: the hidden activations, or x itself (for a cnn, its features).
func (ws *workspace) input(x blas64.General) blas64.General {
	if ws.l.hidden > 0 {
		return matrix(ws.h, x.Rows, ws.l.hidden)
	}
	return x
}

// forward computes the outputs (pre-head) for the rows of x into ws.z, and
// the hidden activations into ws.h (and a cnn's maps into ws.cb). x.Rows
// must not exceed ws.cap.
func (ws *workspace) forward(p []float64, x blas64.General) {
	l, b := ws.l, x.Rows
	if l.conv != nil {
		x = ws.convForward(p, x)
	}
	in := x
	if l.hidden > 0 {
		w1 := matrix(p[l.w1:l.b1], l.hidden, l.dense)
		h := matrix(ws.h, b, l.hidden)
		gemmNT(x, w1, h)
		b1 := p[l.b1:l.w2]
		for i := range b {
			row := h.Data[i*l.hidden : (i+1)*l.hidden]
			for j := range row {
				row[j] = repmath.Tanh(row[j] + b1[j])
			}
		}
		in = h
	}
	feed := l.feed()
	z := ws.z[:b*l.out]
	b2 := p[l.b2 : l.b2+l.out]
	if l.out == 1 {
		gemvN(in, p[l.w2:l.w2+feed], z)
		for i := range z {
			z[i] += b2[0]
		}
		return
	}
	gemmNT(in, matrix(p[l.w2:l.b2], l.out, feed), matrix(z, b, l.out))
	for i := range b {
		row := z[i*l.out : (i+1)*l.out]
		for k := range row {
			row[k] += b2[k]
		}
	}
}

// head turns the outputs in ws.z for labels y, in place, into
// ∂loss/∂output. With withLoss it returns the sum of the per-example losses
// (training steps skip that cost), else 0.
func (ws *workspace) head(y []float64, withLoss bool) float64 {
	l := ws.l
	var sum float64
	switch l.head {
	case headSigmoid:
		z := ws.z[:len(y)]
		for i, zi := range z {
			if withLoss {
				sum += softplus(zi) - float64(y[i]*zi)
			}
			z[i] = sigmoid(zi) - y[i]
		}
	case headIdentity:
		z := ws.z[:len(y)]
		for i, zi := range z {
			r := zi - y[i]
			sum += float64(0.5 * r * r)
			z[i] = r
		}
	case headSoftmax:
		for i, yi := range y {
			row := ws.z[i*l.out : (i+1)*l.out]
			lse := logSumExp(row)
			c := int(yi)
			sum += lse - row[c]
			for k := range row {
				row[k] = repmath.Exp(row[k] - lse)
			}
			row[c]--
		}
	}
	return sum
}

// backward writes into grad the sum over the rows of x of the per-example
// loss gradients, from ∂loss/∂output left in ws.z by head. grad is
// overwritten, not accumulated.
func (ws *workspace) backward(p []float64, x blas64.General, grad []float64) {
	l, b := ws.l, x.Rows
	if l.conv != nil {
		x = ws.features(b)
	}
	feed := l.feed()
	in := ws.input(x)
	r := ws.z[:b*l.out]
	gb2 := grad[l.b2 : l.b2+l.out]
	clear(gb2)
	if l.out == 1 {
		gemvT(in, r, grad[l.w2:l.w2+feed])
		for _, ri := range r {
			gb2[0] += ri
		}
	} else {
		rm := matrix(r, b, l.out)
		gemmTN(rm, in, matrix(grad[l.w2:l.b2], l.out, feed))
		for i := range b {
			for k, v := range r[i*l.out : (i+1)*l.out] {
				gb2[k] += v
			}
		}
	}
	// A cnn's features get ∂loss/∂features into its last pooled map's
	// gradient: R·W2 without a dense layer, dh·W1 with one.
	var dfeat blas64.General
	if l.conv != nil {
		dfeat = matrix(ws.cb.dpool[len(l.conv)-1], b, l.dense)
	}
	if l.hidden == 0 {
		if l.conv != nil {
			gemmNN(matrix(r, b, l.out), matrix(p[l.w2:l.b2], l.out, l.dense), dfeat)
			ws.convBackward(p, b, grad)
		}
		return
	}
	// ∂loss/∂h = R·W2, then through tanh: ⊙ (1 − h²).
	dh := matrix(ws.dh, b, l.hidden)
	gemmNN(matrix(r, b, l.out), matrix(p[l.w2:l.b2], l.out, l.hidden), dh)
	gb1 := grad[l.b1:l.w2]
	clear(gb1)
	for i := range b {
		hrow := ws.h[i*l.hidden : (i+1)*l.hidden]
		drow := dh.Data[i*l.hidden : (i+1)*l.hidden]
		for j, hv := range hrow {
			drow[j] = float64(drow[j] * (1 - float64(hv*hv)))
			gb1[j] += drow[j]
		}
	}
	gemmTN(dh, x, matrix(grad[l.w1:l.b1], l.hidden, l.dense))
	if l.conv != nil {
		gemmNN(dh, matrix(p[l.w1:l.b1], l.hidden, l.dense), dfeat)
		ws.convBackward(p, b, grad)
	}
}

// lossGrad runs a full pass over the rows of x with labels y: it returns the
// summed loss and, when grad is non-nil, overwrites grad with the summed
// gradient.
func (ws *workspace) lossGrad(p []float64, x blas64.General, y []float64, grad []float64) float64 {
	ws.forward(p, x)
	loss := ws.head(y, true)
	if grad != nil {
		ws.backward(p, x, grad)
	}
	return loss
}

// grad overwrites grad with the summed loss gradient over the rows of x.
func (ws *workspace) grad(p []float64, x blas64.General, y []float64, grad []float64) {
	ws.forward(p, x)
	ws.head(y, false)
	ws.backward(p, x, grad)
}

func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + repmath.Exp(-z))
	}
	e := repmath.Exp(z)
	return e / (1 + e)
}

// softplus is log(1 + e^z), computed without overflow.
func softplus(z float64) float64 {
	if z > 0 {
		return z + repmath.Log1p(repmath.Exp(-z))
	}
	return repmath.Log1p(repmath.Exp(z))
}

func logSumExp(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	var s float64
	for _, x := range v {
		s += repmath.Exp(x - m)
	}
	return m + repmath.Log(s)
}

func softmaxInPlace(v []float64) {
	lse := logSumExp(v)
	for i := range v {
		v[i] = repmath.Exp(v[i] - lse)
	}
}
