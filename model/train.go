package model

import (
	"math"

	"github.com/scellis/scellis/diag"
)

// Optimizers, the values of TrainConfig.Optimizer.
const (
	OptSGD   = "sgd"
	OptAdamW = "adamw"
)

// TrainConfig says how Train runs.
//
// The length of a run is Steps minibatch steps when Steps > 0, else Epochs
// passes over the data in minibatches of BatchSize (default 32; the last
// batch of an epoch may be shorter). In Steps mode batches are cut from a
// stream of shuffled epochs and may straddle two of them.
//
// Each step minimises the mean minibatch loss plus
//
//	L2/2·‖w‖²  +  Mu/2·‖θ − Anchor‖²  +  ⟨Correction, θ⟩
//
// where w are the weights (L2 and WeightDecay never touch biases) and θ all
// parameters: Anchor is FedProx's global model (Mu its proximal weight),
// Correction SCAFFOLD's c − c_i, added to every gradient. Optimizer "sgd"
// (default) steps θ ← θ − LR·g; "adamw" is Adam with bias correction
// (Beta1, Beta2 default 0.9 and 0.999, ε = 1e-8) and decoupled weight decay
// θ ← θ − LR·(m̂/(√v̂+ε) + WeightDecay·w). WeightDecay is decoupled under
// sgd too: θ ← θ − LR·(g + WeightDecay·w).
//
// DP, when set, turns the run into DP-SGD (see DPSGD); BatchSize is then
// ignored.
type TrainConfig struct {
	Epochs      int
	BatchSize   int
	LR          float64
	L2          float64
	Seed        uint64
	Optimizer   string // "sgd" | "adamw"
	Beta1       float64
	Beta2       float64
	WeightDecay float64
	Steps       int       // if > 0, the number of minibatch steps instead of epochs
	Mu          float64   // FedProx proximal weight
	Anchor      []float64 // FedProx anchor: Mu/2·‖θ − Anchor‖²
	Correction  []float64 // SCAFFOLD: added to every gradient (c − c_i)
	DP          *DPSGD
	// Adam, when set with Optimizer "adamw", carries AdamW's moments and
	// step count across Train calls (DiLoCo keeps its inner optimizer from
	// one outer round to the next). Train reads and updates it in place; a
	// zero AdamState starts fresh. Nil means fresh moments for every call.
	Adam *AdamState
	// Interrupt, when set, is called after every optimizer step with the
	// work the step did (examples × parameters, about the multiply-adds of
	// its gradients — for a cnn its convolutions' multiply-adds instead of
	// their parameters —, plus the update and a fixed cost per step). A non-nil error stops training at once: Train returns
	// it, and the parameters are left as the last step made them. The
	// sandbox uses it to charge training to the step budget and to honour
	// cancellation (a shard timeout, SIGINT) inside a long run.
	Interrupt func(work int) error
}

// AdamState is AdamW's first and second moment estimates, one per
// parameter, and the number of steps taken (for bias correction).
type AdamState struct {
	M, V []float64
	T    int
}

// TrainStats reports a finished run. Steps is the number of optimizer steps,
// Examples the number of example gradients computed (under DP, the sum of the
// Poisson batch sizes), FinalLoss the mean loss (Model.Loss) of the trained
// model on the training data. FinalLoss is computed from the raw data without
// noise: under DP it is not private and must not leave the site unprotected.
type TrainStats struct {
	Steps     int
	Examples  int
	FinalLoss float64
}

// defaultBatch is the minibatch size when TrainConfig.BatchSize is 0.
const defaultBatch = 32

// Train fits m to d in place, as cfg says. Refused configurations are
// *diag.Diagnostic values and leave m unchanged; a run that diverges (NaN or
// Inf in the parameters) returns diag.NonFinite and leaves the diverged
// parameters in m.
//
// Without DP, Train is deterministic: the same m, d and cfg give
// byte-identical Params on every run on the same architecture (the order of
// every floating-point sum is fixed; gonum's blocked matrix products keep
// their inner sums sequential). With DP, sampling and noise come from
// cryptographically secure generators and no two runs agree.
func Train(m *Model, d *Dataset, cfg TrainConfig) (TrainStats, error) {
	t, err := newTrainer(m, d, cfg)
	if err != nil {
		return TrainStats{}, err
	}
	return t.run()
}

// trainer holds one run's state; every buffer is allocated up front.
type trainer struct {
	m    *Model
	l    layout
	d    *Dataset // standardised when m.Std is set
	cfg  TrainConfig
	ws   *workspace
	grad []float64
	// AdamW moments and step count.
	m1, m2 []float64
	t      int
	// DP-SGD state (nil without DP).
	dp *dpState

	stats TrainStats
}

func newTrainer(m *Model, d *Dataset, cfg TrainConfig) (*trainer, error) {
	l, err := m.check()
	if err != nil {
		return nil, err
	}
	if err := checkData(l, d); err != nil {
		return nil, err
	}
	if d.Rows() == 0 {
		return nil, diag.New(diag.DatasetTooSmall, d.Name, "no rows to train on").
			WithHelp("train on a dataset with at least one row")
	}
	if err := cfg.check(l.n); err != nil {
		return nil, err
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = defaultBatch
	}
	if cfg.Optimizer == "" {
		cfg.Optimizer = OptSGD
	}
	if cfg.Beta1 == 0 {
		cfg.Beta1 = 0.9
	}
	if cfg.Beta2 == 0 {
		cfg.Beta2 = 0.999
	}
	if m.Std != nil {
		d = m.Std.Apply(d)
	}
	t := &trainer{
		m:    m,
		l:    l,
		d:    d,
		cfg:  cfg,
		grad: make([]float64, l.n),
	}
	if cfg.Optimizer == OptAdamW {
		if a := cfg.Adam; a != nil {
			if a.M == nil && a.V == nil && a.T == 0 {
				a.M, a.V = make([]float64, l.n), make([]float64, l.n)
			}
			t.m1, t.m2, t.t = a.M, a.V, a.T
		} else {
			t.m1 = make([]float64, l.n)
			t.m2 = make([]float64, l.n)
		}
	}
	if cfg.DP != nil {
		t.ws = newWorkspace(l, 1)
		t.dp = newDPState(l.n, d.Rows())
	} else {
		t.ws = newWorkspace(l, min(cfg.BatchSize, d.Rows()))
	}
	return t, nil
}

func (c *TrainConfig) check(nParams int) error {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.InvalidValue, "train config", format, args...)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.Steps < 0:
		return bad("Steps is %d; it must be ≥ 0", c.Steps)
	case c.Epochs < 0:
		return bad("Epochs is %d; it must be ≥ 0", c.Epochs)
	case c.Steps == 0 && c.Epochs == 0 && (c.DP == nil || c.DP.Steps == 0):
		return bad("neither Epochs nor Steps is set, so there is nothing to train").
			WithHelp("set epochs (passes over the data) or steps (minibatch steps)")
	case c.BatchSize < 0:
		return bad("BatchSize is %d; it must be ≥ 1 (0 means %d)", c.BatchSize, defaultBatch)
	case !(c.LR > 0) || !finite(c.LR):
		return bad("learning rate %v must be positive and finite", c.LR).WithHelp("try 0.1 for sgd or 0.01 for adamw")
	case !(c.L2 >= 0) || !finite(c.L2):
		return bad("L2 %v must be ≥ 0 and finite", c.L2)
	case !(c.WeightDecay >= 0) || !finite(c.WeightDecay):
		return bad("WeightDecay %v must be ≥ 0 and finite", c.WeightDecay)
	case !(c.Mu >= 0) || !finite(c.Mu):
		return bad("Mu %v must be ≥ 0 and finite", c.Mu)
	case c.Optimizer != "" && c.Optimizer != OptSGD && c.Optimizer != OptAdamW:
		return bad("unknown optimizer %q", c.Optimizer).WithHelp("use %q or %q", OptSGD, OptAdamW)
	case c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1:
		return bad("AdamW betas (%v, %v) must lie in [0, 1)", c.Beta1, c.Beta2)
	case c.Mu > 0 && len(c.Anchor) != nParams:
		return bad("Mu is %v but Anchor has %d values; the model has %d parameters", c.Mu, len(c.Anchor), nParams).
			WithHelp("pass the global model's parameters as the anchor")
	case c.Anchor != nil && len(c.Anchor) != nParams:
		return bad("Anchor has %d values; the model has %d parameters", len(c.Anchor), nParams)
	case c.Correction != nil && len(c.Correction) != nParams:
		return bad("Correction has %d values; the model has %d parameters", len(c.Correction), nParams)
	case c.Adam != nil && !(c.Adam.M == nil && c.Adam.V == nil && c.Adam.T == 0) &&
		(len(c.Adam.M) != nParams || len(c.Adam.V) != nParams || c.Adam.T < 0):
		return bad("AdamState has %d and %d moments after %d steps; the model has %d parameters", len(c.Adam.M), len(c.Adam.V), c.Adam.T, nParams).
			WithHelp("pass a zero AdamState to start a new optimizer")
	}
	for _, v := range c.Anchor {
		if !finite(v) {
			return bad("Anchor holds %v", v)
		}
	}
	for _, v := range c.Correction {
		if !finite(v) {
			return bad("Correction holds %v", v)
		}
	}
	if c.DP != nil {
		return c.DP.check()
	}
	return nil
}

func (t *trainer) run() (TrainStats, error) {
	var err error
	if t.dp != nil {
		err = t.runDP()
	} else {
		err = t.runBatches()
	}
	if err != nil {
		return t.stats, err
	}
	for _, v := range t.m.Params {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return t.stats, diag.New(diag.NonFinite, t.d.Name, "training diverged after %d steps: the parameters hold %v", t.stats.Steps, v).
				WithHelp("lower the learning rate, or standardise the features")
		}
	}
	// The loss of the trained model on the (standardised) training rows.
	plain := &Model{Spec: t.m.Spec, Params: t.m.Params}
	t.stats.FinalLoss = plain.Loss(t.d)
	return t.stats, nil
}

// runBatches is deterministic minibatch training: shuffles come from a
// generator keyed by cfg.Seed.
func (t *trainer) runBatches() error {
	n, bs := t.d.Rows(), min(t.cfg.BatchSize, t.d.Rows())
	r := newRand("shuffle", t.cfg.Seed)
	perm := identity(n)
	if t.cfg.Steps > 0 {
		batch := make([]int, bs)
		pos := n // forces a shuffle before the first batch
		for range t.cfg.Steps {
			for k := range batch {
				if pos == n {
					shuffle(r, perm)
					pos = 0
				}
				batch[k] = perm[pos]
				pos++
			}
			t.minibatch(batch)
			if err := t.interrupt(len(batch)); err != nil {
				return err
			}
		}
		return nil
	}
	for range t.cfg.Epochs {
		shuffle(r, perm)
		for i := 0; i < n; i += bs {
			t.minibatch(perm[i:min(i+bs, n)])
			if err := t.interrupt(min(bs, n-i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// interrupt reports a step over examples rows to cfg.Interrupt.
func (t *trainer) interrupt(examples int) error {
	if t.cfg.Interrupt == nil {
		return nil
	}
	return t.cfg.Interrupt(examples*t.l.exampleWork() + len(t.m.Params) + stepOverhead)
}

// stepOverhead is the fixed cost of an optimizer step (gathering the batch,
// the update's bookkeeping) in multiply-adds: a tiny model on a tiny batch
// still costs about a microsecond a step.
const stepOverhead = 512

// minibatch gathers rows idx, computes their mean gradient and steps.
func (t *trainer) minibatch(idx []int) {
	l, ws := t.l, t.ws
	raw := t.d.X.RawMatrix()
	for k, i := range idx {
		copy(ws.xb[k*l.in:(k+1)*l.in], raw.Data[i*raw.Stride:i*raw.Stride+l.in])
		ws.yb[k] = t.d.Y[i]
	}
	x := matrix(ws.xb, len(idx), l.in)
	ws.grad(t.m.Params, x, ws.yb[:len(idx)], t.grad)
	inv := 1 / float64(len(idx))
	for j := range t.grad {
		t.grad[j] *= inv
	}
	t.stats.Examples += len(idx)
	t.update()
}

// update adds the data-independent terms to t.grad (the mean data gradient)
// and takes one optimizer step.
func (t *trainer) update() {
	p, g, c := t.m.Params, t.grad, &t.cfg
	if c.L2 > 0 {
		t.l.eachBlock(func(lo, hi int, mask float64) {
			for j := lo; j < hi; j++ {
				g[j] += float64(c.L2 * mask * p[j])
			}
		})
	}
	if c.Mu > 0 {
		for j := range g {
			g[j] += float64(c.Mu * (p[j] - c.Anchor[j]))
		}
	}
	if c.Correction != nil {
		for j := range g {
			g[j] += c.Correction[j]
		}
	}
	switch c.Optimizer {
	case OptAdamW:
		t.t++
		if c.Adam != nil {
			c.Adam.T = t.t
		}
		b1, b2 := c.Beta1, c.Beta2
		// math.Pow of an integer power is repeated multiplication in
		// pure Go, no product feeding an add: the same bits everywhere.
		bc1 := 1 - math.Pow(b1, float64(t.t))
		bc2 := 1 - math.Pow(b2, float64(t.t))
		t.l.eachBlock(func(lo, hi int, mask float64) {
			for j := lo; j < hi; j++ {
				t.m1[j] = float64(b1*t.m1[j]) + float64((1-b1)*g[j])
				t.m2[j] = float64(b2*t.m2[j]) + float64((1-b2)*g[j]*g[j])
				mh := t.m1[j] / bc1
				vh := t.m2[j] / bc2
				p[j] -= float64(c.LR * (mh/(math.Sqrt(vh)+adamEps) + float64(c.WeightDecay*mask*p[j])))
			}
		})
	default:
		t.l.eachBlock(func(lo, hi int, mask float64) {
			for j := lo; j < hi; j++ {
				p[j] -= float64(c.LR * (g[j] + float64(c.WeightDecay*mask*p[j])))
			}
		})
	}
	t.stats.Steps++
}

const adamEps = 1e-8

// exampleGrad overwrites g with the loss gradient of row i alone.
func (t *trainer) exampleGrad(i int, g []float64) {
	raw := t.d.X.RawMatrix()
	x := rowView(raw.Data[i*raw.Stride : i*raw.Stride+t.l.in])
	t.ws.grad(t.m.Params, x, t.d.Y[i:i+1], g)
}
