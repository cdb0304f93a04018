package model

import (
	crand "crypto/rand"
	"math"
	"math/rand/v2"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

// DPSGD configures differentially private SGD (Abadi et al. 2016) in the form
// the RDP accountant of package dp assumes (Mironov, Talwar, Zhang 2019):
// every step draws a Poisson sample — each example included independently
// with probability Q — clips each sampled example's gradient to L2 norm Clip,
// sums the clipped gradients, adds Gaussian noise of standard deviation
// Sigma·Clip to every coordinate, and divides by the expected batch size Q·n.
//
// The run has Steps steps when Steps > 0, else TrainConfig.Steps, else
// TrainConfig.Epochs·round(1/Q) (one epoch is 1/Q expected-size batches).
// The regularisers of TrainConfig (L2, the FedProx and SCAFFOLD terms) and
// the optimizer act after the noise, on data-independent values, so they do
// not change the privacy cost. The accountant needs (Q, Sigma, steps taken);
// TrainStats.Steps reports the last.
type DPSGD struct {
	Q     float64 // Poisson sampling rate, in (0, 1]
	Clip  float64 // per-example L2 clipping bound C
	Sigma float64 // noise multiplier: noise std = Sigma·Clip
	Steps int
}

func (s *DPSGD) check() error {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.InvalidValue, "DP-SGD", format, args...)
	}
	switch {
	case !(s.Q > 0 && s.Q <= 1):
		return bad("sampling rate q = %v is outside (0, 1]", s.Q).WithHelp("q is the expected batch size divided by the number of rows")
	case !(s.Clip > 0) || math.IsInf(s.Clip, 0):
		return bad("clipping bound %v must be positive and finite", s.Clip)
	case !(s.Sigma > 0) || math.IsInf(s.Sigma, 0):
		return bad("noise multiplier σ = %v must be positive and finite", s.Sigma).
			WithHelp("σ ≤ 0 gives no privacy; use 'scellis privacy calibrate' to choose σ for a target ε")
	case s.Steps < 0:
		return bad("Steps is %d; it must be ≥ 0", s.Steps)
	}
	return nil
}

// dpState is one DP-SGD run's randomness and buffers.
type dpState struct {
	sample *rand.ChaCha8 // Poisson sampling decisions: keyed from crypto/rand
	noise  *dp.Noise
	idx    []int     // this step's sample
	ex     []float64 // one example's gradient
	// onClipped, when set (tests only), sees every clipped example gradient
	// and its norm before clipping.
	onClipped func(g []float64, norm float64)
}

func newDPState(nParams, nRows int) *dpState {
	var key [32]byte
	if _, err := crand.Read(key[:]); err != nil {
		panic("model: crypto/rand failed: " + err.Error())
	}
	return &dpState{
		sample: rand.NewChaCha8(key),
		noise:  dp.NewNoise(),
		idx:    make([]int, 0, nRows),
		ex:     make([]float64, nParams),
	}
}

// poissonSample appends to idx the examples of 0..n−1 included in this
// step's Poisson sample, each independently with probability q.
//
// Rather than one Bernoulli draw per example, it draws the gaps between
// included examples, which are independent and geometric: P(gap = k) =
// (1−q)^k·q, by inversion k = ⌊ln U / ln(1−q)⌋ with U uniform on (0, 1].
// That is the same distribution as n independent Bernoulli(q) decisions,
// at a cost proportional to the sample (q·n draws) rather than to n. U comes
// from the crypto-keyed ChaCha8 stream, so no party can predict the sample.
func (s *dpState) poissonSample(idx []int, n int, q float64) []int {
	if q >= 1 {
		for i := range n {
			idx = append(idx, i)
		}
		return idx
	}
	logKeep := math.Log1p(-q)
	for i := -1; ; {
		u := float64(s.sample.Uint64()>>11+1) * 0x1p-53 // (0, 1]
		gap := math.Floor(math.Log(u) / logKeep)
		if gap >= float64(n-1-i) {
			return idx
		}
		i += 1 + int(gap)
		idx = append(idx, i)
	}
}

// dpSteps is the number of DP-SGD steps cfg asks for.
func (c *TrainConfig) dpSteps() int {
	switch {
	case c.DP.Steps > 0:
		return c.DP.Steps
	case c.Steps > 0:
		return c.Steps
	}
	return c.Epochs * max(1, int(math.Round(1/c.DP.Q)))
}

func (t *trainer) runDP() error {
	for range t.cfg.dpSteps() {
		if err := t.interrupt(t.dpStep()); err != nil {
			return err
		}
	}
	return nil
}

// dpStep is one DP-SGD step: Poisson sample, per-example clip, sum, noise,
// divide by the expected batch size, then the optimizer step. It returns the
// size of the sampled batch.
func (t *trainer) dpStep() int {
	s, cfg := t.dp, t.cfg.DP
	n := t.d.Rows()
	s.idx = s.poissonSample(s.idx[:0], n, cfg.Q)
	clear(t.grad)
	for _, i := range s.idx {
		t.exampleGrad(i, s.ex)
		norm := dp.ClipL2(s.ex, cfg.Clip)
		if s.onClipped != nil {
			s.onClipped(s.ex, norm)
		}
		for j, v := range s.ex {
			t.grad[j] += v
		}
	}
	s.noise.AddGaussian(t.grad, cfg.Sigma*cfg.Clip)
	inv := 1 / (cfg.Q * float64(n))
	for j := range t.grad {
		t.grad[j] *= inv
	}
	t.stats.Examples += len(s.idx)
	t.update()
	return len(s.idx)
}
