package model

import (
	"fmt"
	"iter"
	"math"
	"slices"

	"gonum.org/v1/gonum/blas/blas64"

	"github.com/scellis/scellis/diag"
)

// Metrics scores a model on a dataset. Fields that do not apply to the
// model's kind are zero (never NaN, so metrics always encode as JSON):
//
//   - classification: LogLoss (mean cross-entropy, nats), Accuracy, Correct;
//     AUC for binary models (0 when only one class is present);
//   - regression: RMSE.
//
// Loss is the mean per-example training objective without regularisation:
// equal to LogLoss for classifiers and to ½·RMSE² for regression. N, Correct
// and N·Loss are sums, so metrics from several sites aggregate exactly.
type Metrics struct {
	N        int
	LogLoss  float64
	Accuracy float64
	AUC      float64
	RMSE     float64
	Loss     float64
	Correct  int
}

// evalChunk is how many rows a scoring pass holds at once.
const evalChunk = 256

// Check reports whether d fits m: the number of features, and labels the
// model's head accepts (0/1 for binary, integers 0..K−1 for K classes, finite
// numbers for regression). Train calls it; call it before Evaluate or Loss
// on data you did not check, since those panic on a mismatch.
func (m *Model) Check(d *Dataset) error {
	l, err := m.check()
	if err != nil {
		return err
	}
	return checkData(l, d)
}

func checkData(l layout, d *Dataset) error {
	if err := d.check(); err != nil {
		return err
	}
	if d.Rows() > 0 && d.Dims() != l.in {
		return diag.New(diag.InvalidValue, d.Name, "dataset has %d features, the model %d inputs", d.Dims(), l.in).
			WithHelp("build the model with Inputs = %d, the number of non-label columns", d.Dims())
	}
	for i, y := range d.Y {
		if math.IsNaN(y) || math.IsInf(y, 0) {
			return diag.New(diag.InvalidValue, d.Name, "label of row %d is %v", i+1, y)
		}
		if l.classes == 0 {
			continue
		}
		if y != math.Trunc(y) || y < 0 || y >= float64(l.classes) {
			h := fmt.Sprintf("labels must be the integers 0..%d", l.classes-1)
			if l.classes == 2 {
				h = "a binary model needs labels 0 and 1; use softmax (or an mlp with Classes = K) for more classes"
			}
			return diag.New(diag.InvalidValue, d.Name, "label %v of row %d is not a class of a %d-class model", y, i+1, l.classes).
				WithHelp("%s", h)
		}
	}
	return nil
}

// eachChunk calls fn on successive blocks of at most ws.cap rows of d
// (evalChunk, or fewer for wide models: newScoringWorkspace), standardised
// by m.Std when it is set. Loss sums block by block, so the block size is
// part of a result: it depends on the model's shape only
// (TestScoringWorkspace).
func (m *Model) eachChunk(l layout, d *Dataset, ws *workspace, fn func(x blas64.General, y []float64)) {
	n := d.Rows()
	if n == 0 {
		return
	}
	raw := d.X.RawMatrix()
	for i := 0; i < n; i += ws.cap {
		r := min(ws.cap, n-i)
		x := rowsView(raw.Data, raw.Stride, i, r, l.in)
		if m.Std != nil {
			for k := range r {
				m.Std.applyRow(ws.xb[k*l.in:(k+1)*l.in], raw.Data[(i+k)*raw.Stride:(i+k)*raw.Stride+l.in])
			}
			x = matrix(ws.xb, r, l.in)
		}
		fn(x, d.Y[i:i+r])
	}
}

// Loss returns the mean per-example loss of m on d (log-loss for
// classifiers, ½(ŷ−y)² for regression), without regularisation terms; 0 for
// an empty dataset. It panics if m.Check(d) fails.
func (m *Model) Loss(d *Dataset) float64 { return m.loss(d, evalChunk) }

// loss is Loss scoring at most rows rows at a time.
func (m *Model) loss(d *Dataset, rows int) float64 {
	l := m.mustCheck(d)
	ws := newScoringWorkspace(l, rows)
	var sum float64
	m.eachChunk(l, d, ws, func(x blas64.General, y []float64) {
		sum += ws.lossGrad(m.Params, x, y, nil)
	})
	if d.Rows() == 0 {
		return 0
	}
	return sum / float64(d.Rows())
}

func (m *Model) mustCheck(d *Dataset) layout {
	l, err := m.check()
	if err == nil {
		err = checkData(l, d)
	}
	if err != nil {
		panic(err)
	}
	return l
}

// Evaluate scores m on d. It panics if m.Check(d) fails.
func Evaluate(m *Model, d *Dataset) Metrics { return evaluate(m, d, evalChunk) }

// evaluate is Evaluate scoring at most rows rows at a time.
func evaluate(m *Model, d *Dataset, rows int) Metrics {
	l := m.mustCheck(d)
	ws := newScoringWorkspace(l, rows)
	n := d.Rows()
	met := Metrics{N: n}
	if n == 0 {
		return met
	}
	var scores []float64
	if l.head == headSigmoid {
		scores = make([]float64, 0, n)
	}
	var sum float64
	m.eachChunk(l, d, ws, func(x blas64.General, y []float64) {
		ws.forward(m.Params, x)
		for i, yi := range y {
			switch l.head {
			case headSigmoid:
				z := ws.z[i]
				sum += softplus(z) - float64(yi*z)
				if (z >= 0) == (yi == 1) {
					met.Correct++
				}
				scores = append(scores, z)
			case headSoftmax:
				row := ws.z[i*l.out : (i+1)*l.out]
				c := int(yi)
				sum += logSumExp(row) - row[c]
				best := 0
				for k, v := range row {
					if v > row[best] {
						best = k
					}
				}
				if best == c {
					met.Correct++
				}
			case headIdentity:
				r := ws.z[i] - yi
				sum += float64(0.5 * r * r)
			}
		}
	})
	met.Loss = sum / float64(n)
	if l.head == headIdentity {
		met.RMSE = math.Sqrt(2 * met.Loss)
		return met
	}
	met.LogLoss = met.Loss
	met.Accuracy = float64(met.Correct) / float64(n)
	if l.head == headSigmoid {
		met.AUC = AUC(scores, d.Y)
	}
	return met
}

// AUC returns the area under the ROC curve of scores against 0/1 labels
// (the Mann–Whitney statistic, ties counted as one half), or 0 when either
// class is absent.
func AUC(scores, labels []float64) float64 {
	n := len(scores)
	idx := identity(n)
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case scores[a] < scores[b]:
			return -1
		case scores[a] > scores[b]:
			return 1
		}
		return 0
	})
	var pos, rankSum float64
	for i := 0; i < n; {
		j := i
		for j < n && scores[idx[j]] == scores[idx[i]] {
			j++
		}
		avg := float64(float64(i+j+1) * 0.5) // mean of 1-based ranks i+1..j
		for k := i; k < j; k++ {
			if labels[idx[k]] == 1 {
				pos++
				rankSum += avg
			}
		}
		i = j
	}
	neg := float64(n) - pos
	if pos == 0 || neg == 0 {
		return 0
	}
	return (rankSum - float64(pos*(pos+1)*0.5)) / (pos * neg)
}

// Predictions yields, for each row i of d in order, m's output for it as
// Predict gives it (the same values), scoring in blocks with one
// workspace rather than one per row: a cnn's maps for one row are
// 10^4–10^6 values, which Predict allocates on every call. The output
// slice is reused: copy it to keep it. It panics if m.Check(d) fails.
func (m *Model) Predictions(d *Dataset) iter.Seq2[int, []float64] {
	return func(yield func(int, []float64) bool) {
		l := m.mustCheck(d)
		ws := newScoringWorkspace(l, evalChunk)
		out := make([]float64, l.out)
		i := 0
		stop := false
		m.eachChunk(l, d, ws, func(x blas64.General, y []float64) {
			if stop {
				return
			}
			ws.forward(m.Params, x)
			for k := range y {
				copy(out, ws.z[k*l.out:(k+1)*l.out])
				switch l.head {
				case headSigmoid:
					out[0] = sigmoid(out[0])
				case headSoftmax:
					softmaxInPlace(out)
				}
				if !yield(i, out) {
					stop = true
					return
				}
				i++
			}
		})
	}
}
