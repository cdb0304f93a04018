package receipt

import "math"

// MaxJobUnits bounds the work units of one job (the sum of its shards'
// prices), whatever an operator configures: with at most 2^20 shards and
// 64 replicas, a peer's credit stays far below 2^63 for any practical
// number of jobs, and AddUnits saturates beyond that.
const MaxJobUnits = 1 << 40

// AddUnits returns a+b for non-negative work units, and false when the sum
// would overflow int64 (or an operand is negative): prices are content
// output, so sums over them are checked, never wrapped.
func AddUnits(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// SatAddUnits is AddUnits saturating at math.MaxInt64, for running credits
// that must never wrap (a deterministic state machine cannot refuse them).
func SatAddUnits(a, b int64) int64 {
	if s, ok := AddUnits(a, b); ok {
		return s
	}
	return math.MaxInt64
}

// SubUnits takes b ≥ 0 units back from a credit a, never below zero and
// leaving a saturated credit saturated (its true value is unknown).
func SubUnits(a, b int64) int64 {
	if a == math.MaxInt64 || b < 0 {
		return a
	}
	return max(a-b, 0)
}
