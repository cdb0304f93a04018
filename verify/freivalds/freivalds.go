// Package freivalds checks matrix products in O(n²) for a verifier peer:
// Freivalds' algorithm with a floating-point rounding bound. It works on
// tensors, so it lives apart from package verify, whose pure decisions the
// coordinator imports (law 3: the coordinator never touches tensor bytes).
package freivalds

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/scellis/scellis/tensor"
	"github.com/scellis/scellis/verify"
)

// Freivalds' check of a matrix product C = A·B: for a random vector r of
// 0s and 1s, A·(B·r) = C·r holds for every r when C is right, and for at
// most half of the r when it is wrong (Freivalds 1977), so k independent
// rounds accept a wrong C with probability at most 2^-k. Each round costs
// three matrix–vector products, O(n²) against the O(n³) of recomputing C.
//
// Floats depart from the exact statement: both sides carry rounding error.
// Row i is accepted when |A·(B·r) − C·r|ᵢ ≤ 4·n·ε·sᵢ, with
// sᵢ = Σⱼ |Aᵢⱼ|·Σₗ |Bⱼₗ| ≥ (|A|·|B|·r)ᵢ and n the inner dimension: that
// is the standard bound on the rounding of a dot product of length n
// (Higham, γₙ), applied to the three products and doubled, so an honest C computed in any
// summation order (another BLAS kernel, another architecture) passes,
// while a C off by more than the rounding scale fails with probability
// ≥ 1/2 per round.

// Result is the outcome of a check.
type Result struct {
	OK     bool `json:"ok"`
	Rounds int  `json:"rounds"`
	// On failure: the round and row where the sides differed, by how much,
	// and the rounding bound that difference exceeded.
	FailedRound int     `json:"failed_round,omitempty"`
	Row         int     `json:"row,omitempty"`
	Residual    float64 `json:"residual,omitempty"`
	Bound       float64 `json:"bound,omitempty"`
}

// ErrNoRandomness is returned when the check is given no random source: r
// must be drawn by the verifier after the worker committed to C.
var ErrNoRandomness = errors.New("freivalds needs a random source")

// Check checks c = a·b with k rounds, reading the random vectors' bits
// from rnd. rnd must be unpredictable to whoever produced c (the verifier
// passes crypto/rand.Reader); a predictable r lets a cheater build a wrong
// C that passes. Shapes that cannot form the product are an error; a
// product that does not check out is OK == false.
func Check(a, b, c *tensor.Matrix, k int, rnd io.Reader) (Result, error) {
	if rnd == nil {
		return Result{}, ErrNoRandomness
	}
	if k < 1 || k > verify.MaxFreivaldsRounds {
		return Result{}, fmt.Errorf("freivalds rounds %d outside 1 to %d", k, verify.MaxFreivaldsRounds)
	}
	for _, m := range []*tensor.Matrix{a, b, c} {
		if m == nil {
			return Result{}, errors.New("freivalds: nil matrix")
		}
		if err := m.Validate(); err != nil {
			return Result{}, err
		}
	}
	if a.Cols != b.Rows || c.Rows != a.Rows || c.Cols != b.Cols {
		return Result{}, fmt.Errorf("freivalds: %d×%d result of a %d×%d by %d×%d product",
			c.Rows, c.Cols, a.Rows, a.Cols, b.Rows, b.Cols)
	}
	for _, m := range []*tensor.Matrix{a, b} {
		if tensor.FirstNonFinite(m.Data) >= 0 {
			return Result{}, errors.New("freivalds: a factor has NaN or Inf entries")
		}
	}
	n, p := a.Cols, b.Cols
	// The k vectors are the columns of one p×k matrix R, so each side is
	// two matrix products the BLAS kernels run fast: A·(B·R) and C·R.
	bits := make([]byte, (p+7)/8)
	rm, err := tensor.NewMatrix(p, k, nil)
	if err != nil {
		return Result{}, err
	}
	for round := 0; round < k; round++ {
		if _, err := io.ReadFull(rnd, bits); err != nil {
			return Result{}, fmt.Errorf("freivalds: drawing r: %w", err)
		}
		for j := 0; j < p; j++ {
			rm.Data[j*k+round] = float64(bits[j/8] >> (j % 8) & 1)
		}
	}
	br, err := tensor.MatMul(b, rm)
	if err != nil {
		return Result{}, err
	}
	left, err := tensor.MatMul(a, br)
	if err != nil {
		return Result{}, err
	}
	right, err := tensor.MatMul(c, rm)
	if err != nil {
		return Result{}, err
	}
	// With r of 0s and 1s, (|B|·r)ⱼ ≤ Σₗ |Bⱼₗ|: the rounding scale of row
	// i is bounded by sᵢ = Σⱼ |Aᵢⱼ|·Σₗ |Bⱼₗ|, the same for every round.
	absB := make([]float64, n)
	for j := 0; j < n; j++ {
		for _, x := range b.Data[j*p : (j+1)*p] {
			absB[j] += math.Abs(x)
		}
	}
	eps := math.Nextafter(1, 2) - 1
	slack := 4 * float64(max(n, 1)) * eps
	bounds := make([]float64, a.Rows)
	for i := range bounds {
		for j, x := range a.Data[i*n : (i+1)*n] {
			bounds[i] += math.Abs(x) * absB[j]
		}
		bounds[i] *= slack
	}
	for round := 0; round < k; round++ {
		for i, bound := range bounds {
			d := math.Abs(left.Data[i*k+round] - right.Data[i*k+round])
			// A NaN in C makes d NaN: !(d <= bound) catches it.
			if !(d <= bound) {
				return Result{Rounds: round + 1, FailedRound: round + 1, Row: i, Residual: d, Bound: bound}, nil
			}
		}
	}
	return Result{OK: true, Rounds: k}, nil
}
