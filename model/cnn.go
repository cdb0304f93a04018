package model

import (
	"github.com/scellis/scellis/diag"

	"gonum.org/v1/gonum/blas/blas64"
)

// A cnn's convolution layers. Each is a 3×3 convolution of stride 1 with
// zero padding 1 (the map keeps its height and width), ReLU, and 2×2 max
// pooling of stride 2. Maps are stored channels last, one example's map
// a row of h·w·c values, so a convolution is one matrix product over the
// batch: the im2col matrix (one row per output pixel, 3·3·Cin columns)
// times the transposed kernel (Cout rows of 3·3·Cin), which leaves the
// output pixels' channels contiguous, as the next layer reads them. The
// products are this package's deterministic kernels (kernels.go), not an
// assembly BLAS: a cnn's results are as replayable across architectures
// as the other models'.

// convKernel is the side of every convolution kernel.
const convKernel = 3

// convLayer is one resolved convolution layer: its input map h×w×cin, its
// output channels, its pooled map ph×pw×cout, and where its kernel (cout
// rows of taps values) and bias lie in the parameter vector.
type convLayer struct {
	h, w, cin, cout int
	ph, pw          int
	wOff, bOff      int
}

// taps is the number of input values one output value reads.
func (c convLayer) taps() int { return convKernel * convKernel * c.cin }

// pixels is the number of output pixels of the convolution per example.
func (c convLayer) pixels() int { return c.h * c.w }

// pooled is the number of values of the pooled map per example.
func (c convLayer) pooled() int { return c.ph * c.pw * c.cout }

// convLayers resolves a cnn's convolution stack: the layers, the width of
// the last pooled map, and the number of their parameters.
func (s Spec) convLayers() ([]convLayer, int, float64, error) {
	bad := func(help, format string, args ...any) ([]convLayer, int, float64, error) {
		return nil, 0, 0, diag.New(diag.InvalidValue, "model cnn", format, args...).WithHelp("%s", help)
	}
	h, w, c := s.Image[0], s.Image[1], s.Image[2]
	if h < 1 || w < 1 || c < 1 {
		return bad("give the image as [height, width, channels], each ≥ 1", "image shape %v has a side below 1", s.Image)
	}
	if float64(h)*float64(w)*float64(c) != float64(s.Inputs) {
		return bad("set inputs to height·width·channels, the CSV's pixel columns", "image %d×%d×%d has %d values, the model %d inputs", h, w, c, h*w*c, s.Inputs)
	}
	if len(s.Conv) == 0 {
		return bad("list the output channels of each convolution layer, e.g. [8, 16]", "a cnn needs at least one convolution layer")
	}
	var layers []convLayer
	off, params, act := 0, 0.0, 0.0
	for i, cout := range s.Conv {
		if cout < 1 {
			return bad("every convolution layer needs at least one output channel", "convolution layer %d has %d output channels", i+1, cout)
		}
		if h < 2 || w < 2 {
			return bad("use fewer convolution layers, or a larger image: each halves the map", "convolution layer %d gets a %d×%d map, which 2×2 pooling cannot halve", i+1, h, w)
		}
		l := convLayer{h: h, w: w, cin: c, cout: cout, ph: h / 2, pw: w / 2}
		// Counted in floats so no product overflows; each product rounded
		// (float64()) so no multiply-add is fused (the package's rule,
		// TestReplayablePackagesHaveNoFMA).
		params += float64(float64(cout)*float64(l.taps())) + float64(cout)
		// A row's activations: im2col, output map, pooled map.
		act += float64(float64(h*w)*float64(l.taps())) + float64(float64(h*w)*float64(cout)) + float64(l.ph*l.pw*cout)
		if params > maxParams || act > maxParams {
			return bad("use fewer channels or a smaller image", "the convolution layers would hold more than %d values per example", maxParams)
		}
		l.wOff = off
		l.bOff = off + cout*l.taps()
		off = l.bOff + cout
		layers = append(layers, l)
		h, w, c = l.ph, l.pw, cout
	}
	return layers, h * w * c, params, nil
}

// exampleWork is about the multiply-adds of one example's forward pass:
// the parameter count for the dense models, and for a cnn each
// convolution's pixels·taps·channels plus the dense part's weights.
func (l layout) exampleWork() int {
	work := l.n
	for _, c := range l.conv {
		work += c.pixels()*c.taps()*c.cout - c.cout*c.taps()
	}
	return work
}

// convRowFloats is how many float64 values the convolution buffers of a
// workspace hold per row: forward (im2col, output map and pooled map of
// each layer; the pool's arg max is counted as one value) and, when
// training, the gradients of the output and pooled maps and of the
// largest im2col matrix.
func (l layout) convRowFloats(scoring bool) int {
	n, maxCol := 0, 0
	for _, c := range l.conv {
		n += c.pixels()*c.taps() + c.pixels()*c.cout + 2*c.pooled()
		if !scoring {
			n += c.pixels()*c.cout + c.pooled()
			maxCol = max(maxCol, c.pixels()*c.taps())
		}
	}
	return n + maxCol
}

// convBuffers are a workspace's per-layer buffers for cap rows.
type convBuffers struct {
	col    [][]float64 // rows·pixels × taps: im2col of the layer's input
	act    [][]float64 // rows·pixels × cout: ReLU output
	pool   [][]float64 // rows × pooled: the next layer's input
	arg    [][]int     // rows × pooled: index in act of each pooled max
	dact   [][]float64 // gradient w.r.t. the ReLU's input (training)
	dpool  [][]float64 // gradient w.r.t. the pooled map (training)
	dcol   []float64   // gradient w.r.t. im2col (training; the largest layer's)
	scored bool
}

func newConvBuffers(l layout, rows int, scoring bool) *convBuffers {
	b := &convBuffers{scored: scoring}
	maxCol := 0
	for _, c := range l.conv {
		b.col = append(b.col, make([]float64, rows*c.pixels()*c.taps()))
		b.act = append(b.act, make([]float64, rows*c.pixels()*c.cout))
		b.pool = append(b.pool, make([]float64, rows*c.pooled()))
		b.arg = append(b.arg, make([]int, rows*c.pooled()))
		if !scoring {
			b.dact = append(b.dact, make([]float64, rows*c.pixels()*c.cout))
			b.dpool = append(b.dpool, make([]float64, rows*c.pooled()))
			maxCol = max(maxCol, c.pixels()*c.taps())
		}
	}
	if !scoring {
		b.dcol = make([]float64, rows*maxCol)
	}
	return b
}

// convForward runs the convolution stack on the rows of x and returns the
// last pooled map, rows × l.dense.
func (ws *workspace) convForward(p []float64, x blas64.General) blas64.General {
	b := x.Rows
	in := x
	for i, c := range ws.l.conv {
		rows := b * c.pixels()
		col := matrix(ws.cb.col[i], rows, c.taps())
		im2col(in, c, col.Data)
		act := matrix(ws.cb.act[i], rows, c.cout)
		gemmNT(col, matrix(p[c.wOff:c.bOff], c.cout, c.taps()), act)
		bias := p[c.bOff : c.bOff+c.cout]
		for r := range rows {
			row := act.Data[r*c.cout : (r+1)*c.cout]
			for k, v := range row {
				row[k] = max(0, v+bias[k])
			}
		}
		maxPool(act.Data, c, b, ws.cb.pool[i], ws.cb.arg[i])
		in = matrix(ws.cb.pool[i], b, c.pooled())
	}
	return in
}

// features is the last forward pass's pooled map for b rows.
func (ws *workspace) features(b int) blas64.General {
	k := len(ws.l.conv) - 1
	return matrix(ws.cb.pool[k], b, ws.l.dense)
}

// convBackward adds to grad the convolution layers' gradients for b rows,
// from dfeat, the gradient w.r.t. the last pooled map (rows × l.dense,
// ws.cb.dpool's last buffer). grad's convolution blocks are overwritten.
func (ws *workspace) convBackward(p []float64, b int, grad []float64) {
	cb := ws.cb
	for i := len(ws.l.conv) - 1; i >= 0; i-- {
		c := ws.l.conv[i]
		rows := b * c.pixels()
		dact := cb.dact[i][:rows*c.cout]
		clear(dact)
		// Pools do not overlap: each pooled value's gradient goes to the
		// one output it took, and only where the ReLU passed it.
		for j, g := range cb.dpool[i][:b*c.pooled()] {
			a := cb.arg[i][j]
			if cb.act[i][a] > 0 {
				dact[a] = g
			}
		}
		gb := grad[c.bOff : c.bOff+c.cout]
		clear(gb)
		for r := range rows {
			for k, v := range dact[r*c.cout : (r+1)*c.cout] {
				gb[k] += v
			}
		}
		dm := matrix(dact, rows, c.cout)
		col := matrix(cb.col[i], rows, c.taps())
		gemmTN(dm, col, matrix(grad[c.wOff:c.bOff], c.cout, c.taps()))
		if i == 0 {
			return
		}
		dcol := matrix(cb.dcol, rows, c.taps())
		gemmNN(dm, matrix(p[c.wOff:c.bOff], c.cout, c.taps()), dcol)
		col2im(dcol.Data, c, b, cb.dpool[i-1])
	}
}

// im2col writes the im2col matrix of the maps in the rows of in (each
// c.h×c.w×c.cin, channels last) into col: row (e·h + y)·w + x holds, for
// each tap (ky, kx) in order and each input channel, the input value at
// (y+ky−1, x+kx−1), or 0 outside the map.
func im2col(in blas64.General, c convLayer, col []float64) {
	taps := c.taps()
	for e := range in.Rows {
		src := in.Data[e*in.Stride : e*in.Stride+c.h*c.w*c.cin]
		for y := range c.h {
			for x := range c.w {
				dst := col[((e*c.h+y)*c.w+x)*taps:][:taps]
				for ky := range convKernel {
					for kx := range convKernel {
						t := dst[(ky*convKernel+kx)*c.cin:][:c.cin]
						sy, sx := y+ky-1, x+kx-1
						if sy < 0 || sy >= c.h || sx < 0 || sx >= c.w {
							clear(t)
							continue
						}
						copy(t, src[(sy*c.w+sx)*c.cin:])
					}
				}
			}
		}
	}
}

// col2im overwrites dst (b maps of c.h×c.w×c.cin) with the sum, for each
// input value, of the gradients of the im2col entries that copied it: the
// adjoint of im2col, in a fixed order.
func col2im(dcol []float64, c convLayer, b int, dst []float64) {
	taps := c.taps()
	dst = dst[:b*c.h*c.w*c.cin]
	clear(dst)
	for e := range b {
		out := dst[e*c.h*c.w*c.cin:]
		for y := range c.h {
			for x := range c.w {
				src := dcol[((e*c.h+y)*c.w+x)*taps:][:taps]
				for ky := range convKernel {
					for kx := range convKernel {
						sy, sx := y+ky-1, x+kx-1
						if sy < 0 || sy >= c.h || sx < 0 || sx >= c.w {
							continue
						}
						t := src[(ky*convKernel+kx)*c.cin:][:c.cin]
						o := out[(sy*c.w+sx)*c.cin:][:c.cin]
						for k, v := range t {
							o[k] += v
						}
					}
				}
			}
		}
	}
}

// maxPool writes the 2×2 max pooling of b maps act (each c.h×c.w×c.cout)
// into pool (each c.ph×c.pw×c.cout), and into arg the index in act of
// each maximum (the first of equal values).
func maxPool(act []float64, c convLayer, b int, pool []float64, arg []int) {
	for e := range b {
		base := e * c.h * c.w * c.cout
		for py := range c.ph {
			for px := range c.pw {
				o := ((e*c.ph+py)*c.pw + px) * c.cout
				for k := range c.cout {
					best := base + ((2*py)*c.w+2*px)*c.cout + k
					for _, d := range [3][2]int{{0, 1}, {1, 0}, {1, 1}} {
						j := base + ((2*py+d[0])*c.w+2*px+d[1])*c.cout + k
						if act[j] > act[best] {
							best = j
						}
					}
					pool[o+k] = act[best]
					arg[o+k] = best
				}
			}
		}
	}
}

// ConvBytes is about how many bytes a cnn's convolution buffers take when
// Train steps through rows rows at once (under DP-SGD, one): the maps
// of every layer and their gradients, which for a large image outgrow the
// parameters. 0 for the other kinds and for an invalid Spec.
func (s Spec) ConvBytes(rows int) int {
	l, err := s.layout()
	if err != nil || l.conv == nil {
		return 0
	}
	return 8 * rows * l.convRowFloats(false)
}
