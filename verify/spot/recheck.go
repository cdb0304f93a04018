package spot

import (
	"cmp"
	"slices"
)

// Accepted is one accepted result of a peer, as far as re-checking goes.
type Accepted[K any] struct {
	Key K     // what the caller needs to find the shard again
	At  int64 // when it was accepted (log time)
}

// RecheckWindow returns the results of a caught peer to re-check: its
// window most recent results accepted after since (the time of its last
// re-check, whose results were checked then), newest first (ties keep the
// given order). Results checked by another peer are re-checked too: the
// check may have paired the peer with an accomplice.
func RecheckWindow[K any](accepted []Accepted[K], since int64, window int) []Accepted[K] {
	var out []Accepted[K]
	for _, a := range accepted {
		if a.At > since {
			out = append(out, a)
		}
	}
	slices.SortStableFunc(out, func(a, b Accepted[K]) int { return cmp.Compare(b.At, a.At) })
	if window >= 0 && len(out) > window {
		out = out[:window]
	}
	return out
}
