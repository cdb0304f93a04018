package spot

import (
	"math"
	"slices"
	"strconv"
)

// Canaries are shards of the job itself whose answer the planner computed
// beforehand: they have the shape, parameters and price of every other
// shard because they are real shards, and a peer cannot tell them apart.
// A result that differs from a canary's known answer is a failed check for
// its peer; an auditor that approved it is caught as a rubber stamp.

// DefaultCanaryRate is the share of an adaptive job's shards that are
// canaries when the job names none.
const DefaultCanaryRate = 0.05

// CanaryCount is how many of n shards are canaries at rate: at least one
// when rate > 0, at most n.
func CanaryCount(n int, rate float64) int {
	if n <= 0 || !(rate > 0) {
		return 0
	}
	k := int(math.Ceil(float64(n) * rate))
	return min(max(k, 1), n)
}

// PickCanaries chooses k distinct shard indexes of n from seed (a partial
// Fisher–Yates shuffle), in increasing order.
func PickCanaries(n, k int, seed []byte) []int {
	k = min(k, n)
	if k <= 0 {
		return nil
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	for i := 0; i < k; i++ {
		j := i + uniform(seed, "canary/"+strconv.Itoa(i), n-i)
		idx[i], idx[j] = idx[j], idx[i]
	}
	out := slices.Clone(idx[:k])
	slices.Sort(out)
	return out
}

// CanaryVerdict judges a result against a canary's known answer.
func CanaryVerdict[T comparable](known, result T) Verdict {
	if result == known {
		return Valid
	}
	return Invalid
}
