package secagg

import (
	"bytes"
	"math"
	"slices"
	"testing"
)

// TestHararyGraph: the masking graph is k-regular and symmetric, every
// party derives the same one from the seed, another seed gives another
// order, and the neighbours of a site are the k/2 nearest on either side
// of the cycle (so removing fewer than k sites never disconnects it).
func TestHararyGraph(t *testing.T) {
	ids := clientIDs(40)
	slices.Sort(ids)
	const k = 8
	seed := bytes.Repeat([]byte{7}, 32)
	g := harary(ids, k, seed)
	for u, nb := range g {
		if len(nb) != k || slices.Contains(nb, u) {
			t.Fatalf("%s has neighbours %v; want %d others", u, nb, k)
		}
		for _, v := range nb {
			if !slices.Contains(g[v], u) {
				t.Fatalf("%s lists %s, not the converse", u, v)
			}
		}
	}
	again := harary(ids, k, seed)
	other := harary(ids, k, bytes.Repeat([]byte{8}, 32))
	same, differ := true, false
	for _, u := range ids {
		same = same && slices.Equal(g[u], again[u])
		differ = differ || !slices.Equal(g[u], other[u])
	}
	if !same || !differ {
		t.Fatalf("graph not a function of its seed (same %v, another seed differs %v)", same, differ)
	}
	// Remove k−1 sites at random positions: the rest stays connected.
	removed := map[string]bool{}
	for _, u := range ids[3 : 3+k-1] {
		removed[u] = true
	}
	start := ids[0]
	seen := map[string]bool{start: true}
	for queue := []string{start}; len(queue) > 0; queue = queue[1:] {
		for _, v := range g[queue[0]] {
			if !removed[v] && !seen[v] {
				seen[v] = true
				queue = append(queue, v)
			}
		}
	}
	if len(seen) != len(ids)-len(removed) {
		t.Fatalf("removing %d sites disconnected the graph: %d of %d reachable", len(removed), len(seen), len(ids)-len(removed))
	}
}

// TestGraphParamsMeetTheBounds recomputes, for the k and t graphParams
// picks, the paper's three failure bounds, and checks the "never both
// secrets" condition 2t > k + 1 and that the degree grows like log n.
func TestGraphParamsMeetTheBounds(t *testing.T) {
	prev := 0
	for _, n := range []int{8, 10, 30, 100, 255, 1000, 10000} {
		k, st, ok := graphParams(n, PlusCorruptRate, PlusDropoutRate)
		if !ok || k%2 != 0 || k >= n-1 || 2*st <= k+1 || st > k {
			t.Fatalf("n=%d: k=%d t=%d ok=%v", n, k, st, ok)
		}
		adv := int(math.Ceil(PlusCorruptRate * float64(n)))
		drop := int(math.Ceil(PlusDropoutRate * float64(n)))
		if p := float64(n) * hyperTails(n, adv, k)[st]; p > math.Ldexp(1, -PlusSecurityBits) {
			t.Errorf("n=%d: P[some site has t corrupt neighbours] ≤ %g", n, p)
		}
		if p := float64(n) * hyperTails(n, drop, k)[k-st+1]; p > math.Ldexp(1, -PlusCorrectnessBits) {
			t.Errorf("n=%d: P[some site keeps fewer than t neighbours] ≤ %g", n, p)
		}
		if k < prev {
			t.Errorf("n=%d: degree %d below the smaller cohort's %d", n, k, prev)
		}
		prev = k
		if float64(k) > 20*math.Log2(float64(n)) {
			t.Errorf("n=%d: degree %d is not O(log n)", n, k)
		}
	}
	if _, _, ok := graphParams(7, PlusCorruptRate, PlusDropoutRate); ok {
		t.Error("seven sites got a sparse graph; with one corrupt and one dropped site assumed, none is safe")
	}
}
