package secagg

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
)

// SecAgg+ (Bell, Bonawitz, Gascón, Lepoint and Raykova, "Secure
// Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020):
// instead of every pair of sites, each site masks with, and Shamir-shares
// its secrets among, its k neighbours on a random Harary graph H(n, k) —
// the n sites on a cycle in a random order, each joined to the k/2 nearest
// on either side. k and the Shamir threshold t are the smallest that keep
// the paper's three bad events below their bounds for the assumed
// fractions of corrupt and dropped sites (graphParams).

// Protocol names how a round masks its inputs. Every party of a round
// must use the same one, so it is a round parameter (in Params and its
// digest).
type Protocol string

const (
	// Pairwise masks every pair of sites (Bonawitz et al. 2017): each
	// site expands n masks, and its secrets are shared t-of-n.
	Pairwise Protocol = "pairwise"
	// SecAggPlus masks each site with its k = O(log n) neighbours on a
	// random Harary graph (Bell et al. 2020): each site expands k + 1
	// masks and shares its secrets among its neighbours.
	SecAggPlus Protocol = "secagg+"
)

func (p Protocol) valid() bool { return p == "" || p == Pairwise || p == SecAggPlus }

// The threat model SecAgg+'s k and t are chosen for, and the failure
// bounds (the values of the paper's evaluation and of Google's reference
// implementation).
const (
	// PlusCorruptRate is the fraction γ of sites assumed to collude
	// with the aggregator.
	PlusCorruptRate = 0.2
	// PlusDropoutRate is the fraction δ of sites assumed to drop out
	// during a round.
	PlusDropoutRate = 0.1
	// PlusSecurityBits σ: the graph of honest survivors stays connected,
	// and no site has t corrupt neighbours, except with probability
	// below 2^-σ each.
	PlusSecurityBits = 40
	// PlusCorrectnessBits η: every site keeps t surviving neighbours
	// (so the round can finish) except with probability below 2^-η.
	PlusCorrectnessBits = 20
	// MaxSitesPlus bounds a SecAgg+ round: shares are per neighbourhood
	// (at most 254 neighbours), so the cohort can exceed MaxSites.
	MaxSitesPlus = 10_000
)

// graphParams returns SecAgg+'s degree k (even) and Shamir threshold t for
// n sites: the smallest k for which
//
//   - the Harary graph minus the corrupt and dropped sites stays connected
//     (removing nodes disconnects H(n, k) only through two disjoint runs
//     of k/2 consecutive removed nodes; union bound over the pairs of
//     runs) except with probability 2^-(σ+1);
//   - some t has: no site has t or more corrupt neighbours (union bound
//     over the n sites, hypergeometric tail) except with probability
//     2^-(σ+1), and every site has at least t surviving neighbours except
//     with probability 2^-η;
//
// with the aggregator allowed to lie about who dropped (the paper's
// semi-malicious bound, t > (t_corrupt + k)/2), and 2t > k + 1 so that no
// two disjoint sets of t holders of a site's shares (its k neighbours and
// itself) exist: the "never both secrets" refusal then protects every
// site as in the pairwise protocol. ok is false when no k < n − 1 works
// (small cohorts): the round then masks every pair, as Pairwise.
func graphParams(n int, corrupt, dropout float64) (k, t int, ok bool) {
	key := graphKey{n, corrupt, dropout}
	if v, hit := graphCache.Load(key); hit {
		g := v.([3]int)
		return g[0], g[1], g[2] == 1
	}
	k, t, ok = findGraphParams(n, corrupt, dropout)
	graphCache.Store(key, [3]int{k, t, map[bool]int{true: 1}[ok]})
	return k, t, ok
}

type graphKey struct {
	n                int
	corrupt, dropout float64
}

// graphCache memoises graphParams: every Params method derives the round.
var graphCache sync.Map

func findGraphParams(n int, corrupt, dropout float64) (k, t int, ok bool) {
	// Counts are rounded up (the reference implementation rounds down):
	// a small cohort is assumed to hold at least one corrupt and one
	// dropped site, so it gets a dense graph, or every pair, rather than
	// one that a single dropout breaks. small keeps float rounding of an
	// exact product from adding a site.
	const small = 1e-9
	adv := int(math.Ceil(corrupt*float64(n) - small))
	drop := int(math.Ceil(dropout*float64(n) - small))
	bad, alive := adv+drop, n-drop
	secEps := math.Ldexp(1, -(PlusSecurityBits+1)) / float64(n)
	corEps := math.Ldexp(1, -PlusCorrectnessBits) / float64(n)
	for k = 2; k < n-1 && k+1 <= MaxSites; k += 2 {
		if k <= bad {
			logGapPairs := math.Log(float64(n)) + math.Log(float64(n-k-1)) - math.Ln2
			lp := logGapPairs + lgamma(bad+1) + lgamma(n-k+1) - lgamma(n+1) - lgamma(bad-k+1)
			if lp >= -(PlusSecurityBits+1)*math.Ln2 {
				continue
			}
		}
		// t1: the least t with P[corrupt neighbours > t1] ≤ secEps.
		tail := hyperTails(n, adv, k) // tail[x] = P[X ≥ x]
		t1 := 0
		for t1 < k && tail[t1+1] > secEps {
			t1++
		}
		// Semi-malicious aggregator (lies about dropouts).
		t1 = int(math.Ceil((float64(t1) + float64(k) - 1.25) / 2))
		// t2: the largest t with P[surviving neighbours < t] ≤ corEps.
		head := hyperTails(n, n-alive, k) // dropped neighbours: P[Y < t] = P[dropped > k−t]
		t2 := 0
		for t2 < k && head[k-t2] <= corEps {
			t2++
		}
		t = max(t1+1, 2, (k+1)/2+1)
		if t <= t2 {
			return k, t, true
		}
	}
	return 0, 0, false
}

func lgamma(x int) float64 {
	v, _ := math.Lgamma(float64(x))
	return v
}

// hyperPMF is P[X = x] for X hypergeometric: x marked among k draws
// without replacement from N items of which K are marked.
func hyperPMF(N, K, k, x int) float64 {
	if x < 0 || x > k || x > K || k-x > N-K {
		return 0
	}
	lc := func(a, b int) float64 { return lgamma(a+1) - lgamma(b+1) - lgamma(a-b+1) }
	return math.Exp(lc(K, x) + lc(N-K, k-x) - lc(N, k))
}

// hyperTails returns P[X ≥ x] for x = 0…k+1, X hypergeometric (k draws
// from N items of which K are marked).
func hyperTails(N, K, k int) []float64 {
	tail := make([]float64, k+2)
	for x := k; x >= 0; x-- {
		tail[x] = tail[x+1] + hyperPMF(N, K, k, x)
	}
	return tail
}

// harary returns the neighbours of every site (sorted) on the Harary
// graph H(n, k) over ids in the order of a uniformly random permutation
// drawn from seed (a keystream of AESCTR keyed by it, with rejection
// sampling, so the permutation is unbiased and every party derives the
// same one).
func harary(ids []string, k int, seed []byte) map[string][]string {
	n := len(ids)
	order := slices.Clone(ids)
	s := AESCTR.stream(seed)
	var buf [8]byte
	uniform := func(bound uint64) uint64 { // uniform in [0, bound)
		limit := math.MaxUint64 - math.MaxUint64%bound
		for {
			clear(buf[:])
			s.XORKeyStream(buf[:], buf[:])
			if v := binary.LittleEndian.Uint64(buf[:]); v < limit {
				return v % bound
			}
		}
	}
	for i := n - 1; i > 0; i-- {
		j := int(uniform(uint64(i + 1)))
		order[i], order[j] = order[j], order[i]
	}
	out := make(map[string][]string, n)
	for i, id := range order {
		var nb []string
		for d := 1; d <= k/2; d++ {
			nb = append(nb, order[(i+d)%n], order[(i-d+n)%n])
		}
		slices.Sort(nb)
		out[id] = slices.Compact(nb)
	}
	return out
}
