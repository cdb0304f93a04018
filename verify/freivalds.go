package verify

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/scellis/scellis/tensor"
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

// FreivaldsResult is the outcome of a check.
type FreivaldsResult struct {
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
var ErrNoRandomness = errors.New("verify: Freivalds needs a random source")

// Freivalds checks c = a·b with k rounds, reading the random vectors' bits
// from rnd. rnd must be unpredictable to whoever produced c (the verifier
// passes crypto/rand.Reader); a predictable r lets a cheater build a wrong
// C that passes. Shapes that cannot form the product are an error; a
// product that does not check out is OK == false.
func Freivalds(a, b, c *tensor.Matrix, k int, rnd io.Reader) (FreivaldsResult, error) {
	if rnd == nil {
		return FreivaldsResult{}, ErrNoRandomness
	}
	if k < 1 || k > MaxFreivaldsRounds {
		return FreivaldsResult{}, fmt.Errorf("verify: Freivalds rounds %d outside 1 to %d", k, MaxFreivaldsRounds)
	}
	for _, m := range []*tensor.Matrix{a, b, c} {
		if m == nil {
			return FreivaldsResult{}, errors.New("verify: Freivalds: nil matrix")
		}
		if err := m.Validate(); err != nil {
			return FreivaldsResult{}, err
		}
	}
	if a.Cols != b.Rows || c.Rows != a.Rows || c.Cols != b.Cols {
		return FreivaldsResult{}, fmt.Errorf("verify: Freivalds: %d×%d result of a %d×%d by %d×%d product",
			c.Rows, c.Cols, a.Rows, a.Cols, b.Rows, b.Cols)
	}
	for _, m := range []*tensor.Matrix{a, b} {
		if tensor.FirstNonFinite(m.Data) >= 0 {
			return FreivaldsResult{}, errors.New("verify: Freivalds: a factor has NaN or Inf entries")
		}
	}
	n, p := a.Cols, b.Cols
	// The k vectors are the columns of one p×k matrix R, so each side is
	// two matrix products the BLAS kernels run fast: A·(B·R) and C·R.
	bits := make([]byte, (p+7)/8)
	rm, err := tensor.NewMatrix(p, k, nil)
	if err != nil {
		return FreivaldsResult{}, err
	}
	for round := 0; round < k; round++ {
		if _, err := io.ReadFull(rnd, bits); err != nil {
			return FreivaldsResult{}, fmt.Errorf("verify: Freivalds: drawing r: %w", err)
		}
		for j := 0; j < p; j++ {
			rm.Data[j*k+round] = float64(bits[j/8] >> (j % 8) & 1)
		}
	}
	br, err := tensor.MatMul(b, rm)
	if err != nil {
		return FreivaldsResult{}, err
	}
	left, err := tensor.MatMul(a, br)
	if err != nil {
		return FreivaldsResult{}, err
	}
	right, err := tensor.MatMul(c, rm)
	if err != nil {
		return FreivaldsResult{}, err
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
				return FreivaldsResult{Rounds: round + 1, FailedRound: round + 1, Row: i, Residual: d, Bound: bound}, nil
			}
		}
	}
	return FreivaldsResult{OK: true, Rounds: k}, nil
}
