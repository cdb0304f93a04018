package spot

// The exact-quorum rule (BOINC's validator), applied to a shard's reports
// after each one: with n reports, r replicas and a attempts,
//
//   - verified when some result is reported by c ≥ r peers and by a strict
//     majority of the reports (2c > n); at most one result can hold a
//     strict majority, so the first to reach it is canonical;
//   - flagged unverified when no sequence of the a−n reports still allowed
//     could verify it: even if they all agreed with the leading result
//     (count c), c+(a−n) < r or 2c+(a−n) ≤ n;
//   - otherwise pending.

// Decision is where a shard stands after its reports.
type Decision int

const (
	Pending Decision = iota
	Verified
	Flagged
)

// Lead is the largest number of reports sharing one result.
func Lead[T comparable](results []T) int {
	lead := 0
	for i := range results {
		c := 0
		for k := range results {
			if results[k] == results[i] {
				c++
			}
		}
		lead = max(lead, c)
	}
	return lead
}

// Majority returns the result held by ≥ r reports and a strict majority.
func Majority[T comparable](results []T, r int) (T, bool) {
	for i := range results {
		c := 0
		for k := range results {
			if results[k] == results[i] {
				c++
			}
		}
		if c >= r && 2*c > len(results) {
			return results[i], true
		}
	}
	var zero T
	return zero, false
}

// Decide applies the rule to the reports so far.
func Decide[T comparable](results []T, replicas, attempts int) (Decision, T) {
	if h, ok := Majority(results, replicas); ok {
		return Verified, h
	}
	var zero T
	n := len(results)
	left, lead := attempts-n, Lead(results)
	if left > 0 && lead+left >= replicas && 2*lead+left > n {
		return Pending, zero
	}
	return Flagged, zero
}

// Need is the smallest number of further reports that could verify a
// shard if they all agreed with its leading result.
func Need[T comparable](results []T, replicas int) int {
	n, lead := len(results), Lead(results)
	return max(replicas-lead, n-2*lead+1, 1)
}
