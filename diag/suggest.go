package diag

import (
	"sort"
	"strings"
)

// Suggest returns the known word closest to s when s is a likely typo of
// it (edit distance at most 2, or s a prefix of at least three letters),
// or "" — for "did you mean …?" help texts.
func Suggest(s string, known []string) string {
	best, bestD := "", 3
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	for _, k := range sorted {
		if dd := editDistance(s, k); dd < bestD || (strings.HasPrefix(k, s) && len(s) >= 3 && bestD > 1) {
			best, bestD = k, min(dd, 1)
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
